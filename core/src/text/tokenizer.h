#pragma once
// A Hugging Face tokenizer, giving the ids, type ids and special token marks Hugging Face's
// libraries give: from a tokenizer.json as tokenizers 0.15 (and transformers' fast tokenizers)
// read it, WordPiece (BERT) and byte-level BPE (RoBERTa, GPT-2) with the normalizers,
// pre-tokenizers, added tokens, post-processors and truncation it declares; or from a
// SentencePiece model (spiece.model, spm.model: T5, ALBERT, DeBERTa-v2/v3) with its
// tokenizer_config.json, as transformers' Python tokenizer of that class reads it.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::text {

/// One text (or pair) as the model reads it; the attention mask is all ones over `ids`.
struct Encoding {
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> type_ids;      ///< 0 for the first text, the template's for the second
  std::vector<std::uint8_t> special_mask;  ///< 1 where the post-processor added a special token
  std::int64_t truncated = 0;              ///< the texts' tokens cut by max_length
};

class Tokenizer {
 public:
  /// Reads `file` (tokenizer.json). A file that is not one, or that declares a component this
  /// reader does not have, is a UsageError naming the file, the key and what is allowed.
  static Tokenizer from_file(const std::filesystem::path& file);
  /// A tokenizer as a model directory holds it: a directory with spiece.model or spm.model reads
  /// that (SentencePiece, with the directory's tokenizer_config.json), else its tokenizer.json;
  /// a file ending in .model is a SentencePiece model (tokenizer_config.json beside it), any
  /// other file a tokenizer.json. UsageError naming the path when it holds none.
  static Tokenizer from_path(const std::filesystem::path& path);
  /// The same from the text of a tokenizer.json; `name` names it in errors.
  static Tokenizer from_json(const std::string& text, const std::string& name);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// `text` (and `pair`), which must be valid UTF-8, with the special tokens of the
  /// post-processor. With `max_length` > 0 the result has at most that many ids: the texts'
  /// tokens are cut from their ends, the longer text first ("longest_first", as transformers'
  /// truncation=True); UsageError when the special tokens alone are longer.
  Encoding encode(std::string_view text, std::optional<std::string_view> pair = std::nullopt,
                  std::int64_t max_length = 0) const;

  /// The id of a token of the vocabulary or an added token, nullopt when it has none.
  std::optional<std::int64_t> token_id(const std::string& token) const;
  /// One more than the largest id it can give (the vocabulary's, the added tokens', the
  /// post-processor's and the padding's): the least vocabulary size of a model for it.
  std::int64_t id_limit() const;
  /// The padding id: the file's "padding" section's, else that of [PAD] or <pad>; nullopt
  /// when it names none.
  std::optional<std::int64_t> pad_id() const;
  /// The mask token's id ([MASK] or <mask>), nullopt when it has none.
  std::optional<std::int64_t> mask_id() const;
  /// How many special tokens the post-processor adds to one text, or to a pair.
  std::int64_t special_tokens_added(bool pair) const;
  /// "WordPiece", "BPE" or "SentencePiece".
  const std::string& model_type() const;
  /// The file it was read from (tokenizer.json, or the SentencePiece model), for messages.
  const std::string& file() const;

  /// A file's reading (text/tokenizer_impl.h: the readers of tokenizer.json and SentencePiece
  /// models make one).
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer::text
