#pragma once
#include <cstdint>
#include <string>

#include "trainer/export.h"

namespace trainer {

/// `s` as a quoted JSON string.
TRAINER_API std::string json_quote(const std::string& s);
/// `v` as a JSON number; NaN and infinities become the strings "NaN", "Infinity",
/// "-Infinity" (what Python's json module reads back).
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
