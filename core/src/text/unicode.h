#pragma once
// Text as code points, and the character classes, decomposition and case mapping that Hugging
// Face's tokenizers apply, so that a tokenizer here gives the ids theirs gives.
#include <cstddef>
#include <string>
#include <string_view>

namespace trainer::text {

/// The character classes of tokenizers 0.15, measured on every code point
/// (scripts/unicode_tables.py): not those of one Unicode version.
enum class CharClass {
  kCleanRemoved,     ///< removed by the BERT normalizer's clean_text (controls, formats, private use)
  kCleanSpace,       ///< made a space by clean_text (whitespace)
  kBertPunctuation,  ///< a token of its own in the BERT pre-tokenizer
  kBertWhitespace,   ///< splits in the BERT pre-tokenizer (Rust's char::is_whitespace)
  kNonspacingMark,   ///< removed by the BERT normalizer's strip_accents (after NFD)
  kCombiningMark,    ///< removed by the StripAccents normalizer
  kPatternLetter,    ///< \p{L} in the byte-level pre-tokenizer's pattern
  kPatternNumber,    ///< \p{N} there
  kPatternSpace,     ///< \s there
  kWord,             ///< \w of Rust's regular expressions: what single_word checks beside an added token
  kReorderedMark,    ///< a mark with a non-zero combining class to tokenizers' NFD (the others stay put)
};

/// Whether `c` is in `cls`.
bool in_class(CharClass cls, char32_t c);

/// Where the first byte of `s` that does not begin a valid UTF-8 sequence is (overlong forms,
/// surrogates and code points above U+10FFFF are invalid, as to Python and Rust), or npos.
std::size_t invalid_utf8_at(std::string_view s);

/// The code points of `s`, which must be valid UTF-8 (invalid_utf8_at(s) == npos).
std::u32string decode_utf8(std::string_view s);

/// Appends `c` to `out` in UTF-8.
void append_utf8(std::string& out, char32_t c);
std::string encode_utf8(std::u32string_view s);

/// The canonical decomposition (NFD) of `s`, as tokenizers' NFD gives it.
std::u32string nfd(std::u32string_view s);

/// Each character of `s` lowercased as Rust's char::to_lowercase does (full mappings: one
/// character may become two).
std::u32string lowercase(std::u32string_view s);

/// Python's unicodedata.normalize("NFKD", s) without the characters of a non-zero combining
/// class (ALBERT's accent removal; the order of the removed marks does not matter).
std::u32string nfkd_without_marks(std::u32string_view s);

/// Python's str.isspace() (what str.split() and str.strip() remove).
bool is_python_space(char32_t c);

/// Python's str.isdigit(): a decimal digit, or a digit of another form (superscripts, circled).
bool is_python_digit(char32_t c);

/// A CJK ideograph of the blocks the BERT normalizer puts spaces around.
bool is_cjk_ideograph(char32_t c);

}  // namespace trainer::text
