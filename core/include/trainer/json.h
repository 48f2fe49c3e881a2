#pragma once
#include <string>

#include "trainer/export.h"

namespace trainer {

/// `s` as a quoted JSON string.
TRAINER_API std::string json_quote(const std::string& s);
/// `v` as a JSON number; NaN and infinities become the strings "NaN", "Infinity",
/// "-Infinity" (what Python's json module reads back).
TRAINER_API std::string json_number(double v);

}  // namespace trainer
