#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "trainer/export.h"

namespace trainer {

/// `s` as a quoted JSON string.
TRAINER_API std::string json_quote(const std::string& s);
/// The name trainer's JSON files give a value that is not a finite number: "NaN", "Infinity",
/// "-Infinity" (the names Python's json module and MLflow read back); nullptr for a finite one.
/// Inline, as the next: the report reader and the MLflow client use them without the core.
inline const char* json_nonfinite_name(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return nullptr;
}
/// The value one of those names stands for; nullopt for any other text.
inline std::optional<double> json_nonfinite_value(std::string_view name) {
  if (name == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (name == "Infinity") return std::numeric_limits<double>::infinity();
  if (name == "-Infinity") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}
/// `v` as a JSON number; NaN and infinities become the strings json_nonfinite_name gives.
TRAINER_API std::string json_number(double v);
/// How deep the arrays and objects of the JSON text `text` nest (brackets inside strings not
/// counted), without parsing it: what a line from a file is checked for before a parser that
/// recurses is given it. Inline: the report reader uses it without linking the core.
inline std::int64_t json_nesting(const std::string& text) {
  std::int64_t depth = 0, most = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > most) most = depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return most;
}

}  // namespace trainer
