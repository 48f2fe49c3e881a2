#pragma once
// Private: the current local time as text (run directory names, lease holder files).
#include <ctime>
#include <string>

namespace trainer::detail {

/// Now, local time, formatted with strftime's `format` (at most 63 characters out).
inline std::string local_time(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

}  // namespace trainer::detail
