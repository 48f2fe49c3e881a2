#pragma once
// Private: checks on config text: valid UTF-8, and numbers. toml11 reads an integer literal past the int64 range, or a
// float literal past the double range, as the range's limit without an error; the literal's
// text says whether that happened.
#include <cstddef>
#include <string>

namespace trainer::detail {

/// Whether the TOML integer literal starting at `column` (0-based) of `line` (decimal, 0x,
/// 0o or 0b, with `_` separators) lies outside the int64 range.
bool integer_literal_overflows(const std::string& line, std::size_t column);

/// Why the TOML float literal starting at `column` of `line` cannot be held by a double
/// (past ±1.8e308, or so close to zero that it underflows), or "" when it can.
std::string float_literal_out_of_range(const std::string& line, std::size_t column);

/// The offset of the first byte of `text` that is not part of a valid UTF-8 sequence
/// (overlong forms, surrogates and code points past U+10FFFF included), or npos.
std::size_t first_invalid_utf8(const std::string& text);
/// "`source`:LINE: invalid UTF-8 at column N (...)" for the first invalid byte, or "".
std::string utf8_problem(const std::string& text, const std::string& source);

/// The shortest text of `d` that reads back as `d` (`30.0`, not `3e+01`; `nan`, `inf`).
std::string format_double(double d);

}  // namespace trainer::detail
