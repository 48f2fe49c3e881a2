#pragma once
// The parts of a tokenizer.json pipeline (normalizers, pre-tokenizers, models), as tokenizers
// 0.15 runs them. Internal to text/tokenizer.cpp and its tests.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace trainer::text::detail {

/// A normalizer: BertNormalizer, Lowercase, NFD, StripAccents, or a Sequence of them.
struct Normalizer {
  enum class Kind { kBert, kLowercase, kNfd, kStripAccents, kSequence };
  Kind kind = Kind::kBert;
  bool clean_text = true, chinese_chars = true, strip_accents = true, lowercase = true;  ///< kBert's
  std::vector<Normalizer> steps;                                                         ///< kSequence's
  void apply(std::u32string& s) const;
};

/// A pre-tokenizer: BertPreTokenizer, ByteLevel, WhitespaceSplit, or a Sequence of them. Splits
/// a piece of text into words (ByteLevel also maps each word's UTF-8 bytes to its characters).
struct PreTokenizer {
  enum class Kind { kBert, kByteLevel, kWhitespaceSplit, kSequence };
  Kind kind = Kind::kBert;
  bool add_prefix_space = false, use_regex = true;  ///< kByteLevel's
  std::vector<PreTokenizer> steps;                  ///< kSequence's
  void apply(std::vector<std::u32string>& words) const;
};

/// The words of `s` as the byte-level pattern splits them (GPT-2's
/// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+).
std::vector<std::u32string> byte_level_split(const std::u32string& s);

/// The character GPT-2's byte-level alphabet gives byte `b`.
char32_t byte_char(unsigned char b);

/// WordPiece: greedy longest match with a continuing-subword prefix, a word longer than
/// max_chars, or with a part not in the vocabulary, is the unknown token.
struct WordPiece {
  std::unordered_map<std::string, std::int64_t> vocab;
  std::int64_t unk_id = 0;
  std::string prefix = "##";
  std::size_t max_chars = 100;
  std::size_t longest = 0;  ///< bytes of the longest token of the vocabulary
  void tokenize(const std::string& word, std::vector<std::int64_t>& out) const;
};

/// BPE: the word's characters (or bytes, with byte_fallback) merged by rank, lowest first and
/// leftmost among equals.
struct Bpe {
  std::unordered_map<std::string, std::int64_t> vocab;
  struct Merge {
    std::uint32_t rank;
    std::uint32_t id;  ///< the merged token's
  };
  std::unordered_map<std::uint64_t, Merge> merges;  ///< by (left id << 32 | right id)
  std::optional<std::int64_t> unk_id;
  std::string prefix, suffix;  ///< continuing_subword_prefix, end_of_word_suffix
  bool fuse_unk = false, byte_fallback = false;
  void tokenize(const std::string& word, std::vector<std::int64_t>& out) const;
};

}  // namespace trainer::text::detail
