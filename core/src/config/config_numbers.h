#pragma once
// Private: numbers in config text. toml11 reads an integer literal past the int64 range, or a
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

/// The shortest text of `d` that reads back as `d` (`30.0`, not `3e+01`; `nan`, `inf`).
std::string format_double(double d);

}  // namespace trainer::detail
