#pragma once
// A SentencePiece model with transformers' tokenizer_config.json, tokenized as transformers'
// Python tokenizer of that class does (sentencepiece_tokenizer.cpp), and the reading of that
// configuration (sentencepiece_config.cpp). Internal to text/.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/byte_trie.h"
#include "text/sentencepiece_model.h"
#include "text/tokenizer_impl.h"

namespace trainer::text::detail {

/// The tokenizer classes of transformers read here: each has its preprocessing and special
/// tokens around a text.
enum class SentencePieceKind { kT5, kAlbert, kDebertaV2 };

/// An added token of tokenizer_config.json's added_tokens_decoder, or a special token's piece.
struct SentencePieceAdded {
  std::string content;
  std::int64_t id = 0;
  bool lstrip = false, rstrip = false, single_word = false, special = false, normalized = false;
};

struct SentencePieceTokenizer final : Tokenizer::Impl {
  using Kind = SentencePieceKind;
  using Added = SentencePieceAdded;
  Kind kind = Kind::kT5;
  std::unique_ptr<detail::SentencePieceModel> sp;
  bool do_lower_case = false, remove_space = true, keep_accents = false;
  std::vector<Added> added;
  /// The added tokens: what transformers' trie splits the text at (the leftmost match, the
  /// longest there).
  detail::ByteTrie added_trie;
  /// What lower-casing leaves as written: the special tokens, then the other normalized added
  /// tokens (at a position, the first listed that matches, as a regular expression's alternation).
  detail::ByteTrie kept_case;

  /// The added token matching `s` at `at`, longest first; nullptr when none does.
  const Added* match(const std::string& s, std::size_t at) const;
  /// transformers' tokenize() before do_lower_case: each character lower-cased on its own,
  /// except where a token of kept_case starts.
  std::string lower_outside_tokens(const std::string& s) const;
  std::vector<std::string> encode_pieces(const std::string& s) const;
  /// The class's _tokenize: its preprocessing and the model's pieces.
  void pieces_of(std::string s, std::vector<std::string>& out) const;
  std::vector<std::int64_t> tokenize(std::string_view input) const override;
  std::optional<std::int64_t> vocab_id(const std::string& token) const override;
};

/// A tokenizer from a tokenizer_config.json's text (`config`, `config_name` in errors) and the
/// model `load` gives (`model_name` in errors; it returns a model or throws), called once the
/// file's class and options are known to be read here. UsageError naming the file and key of what is not read.
std::unique_ptr<Tokenizer::Impl> sentencepiece_from_config(
    const std::string& config, const std::string& config_name, const std::string& model_name,
    const std::function<std::unique_ptr<SentencePieceModel>()>& load);

}  // namespace trainer::text::detail
