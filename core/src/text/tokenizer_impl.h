#pragma once
// What the two kinds of tokenizer file give text::Tokenizer: a tokenizer.json pipeline
// (tokenizer_json.cpp) or a SentencePiece model with transformers' tokenizer_config.json
// (sentencepiece_config.cpp reads it, sentencepiece_tokenizer.cpp tokenizes). Internal to text/.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer.h"

namespace trainer::text {

namespace detail {

/// One element of a template: a special token's ids or a text (0: the first, 1: the pair).
struct TemplatePiece {
  std::vector<std::int64_t> ids;
  int sequence = -1;
  std::int64_t type_id = 0;
};

}  // namespace detail

struct Tokenizer::Impl {
  virtual ~Impl() = default;

  std::string name;        ///< the file, for errors
  std::string model_type;  ///< "WordPiece", "BPE", or "SentencePiece"
  std::unordered_map<std::string, std::int64_t> added_ids;
  std::vector<detail::TemplatePiece> single{{{}, 0, 0}}, pair{{{}, 0, 0}, {{}, 1, 1}};
  std::optional<std::int64_t> padding_id, mask_id;  ///< named by the file; else looked up by content
  std::int64_t limit = 0;
  /// T5's: a text whose ids already end with the template's closing token gets no second one.
  bool close_once = false;
  /// transformers' Python tokenizers truncate a pair one token at a time from the longer text
  /// (the second when they are as long); tokenizers cuts the longer to about half at once.
  bool cut_one_at_a_time = false;
  /// A tokenizer.json's truncation.direction is "Left": transformers then cuts a text at its
  /// start unless a tokenizer_config.json beside the file says truncation_side = "right".
  bool truncates_left = false;

  /// The model's ids for one text (valid UTF-8), before the template.
  virtual std::vector<std::int64_t> tokenize(std::string_view text) const = 0;
  /// A token's id in the model's vocabulary (not the added tokens), nullopt when it has none.
  virtual std::optional<std::int64_t> vocab_id(const std::string& token) const = 0;
};

namespace detail {

/// A tokenizer.json's text; `name` names it in errors.
std::unique_ptr<Tokenizer::Impl> read_tokenizer_json(const std::string& text, const std::string& name);

/// A SentencePiece model file (`model`) with the tokenizer_config.json beside it (`config`).
std::unique_ptr<Tokenizer::Impl> read_sentencepiece(const std::filesystem::path& model,
                                                    const std::filesystem::path& config);

/// The file's bytes, at most `most` of them; UsageError naming it and `what` it should be.
std::string read_bounded(const std::filesystem::path& file, std::uintmax_t most, const char* what);

/// A tokenizer_config.json's text (at most 16 MiB).
std::string read_tokenizer_config(const std::filesystem::path& file);
/// Its JSON (`name` in errors): UsageError when it is not JSON or nests deeper than 16 levels.
nlohmann::json parse_tokenizer_config(const std::string& text, const std::string& name);
/// Whether the config (a JSON object) names a truncation_side: UsageError naming `name` when
/// it is not "right" (a text is cut at its start; trainer cuts at the end).
bool names_truncation_side(const nlohmann::json& config, const std::string& name);

}  // namespace detail

}  // namespace trainer::text
