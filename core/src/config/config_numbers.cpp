#include "config/config_numbers.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <sstream>

namespace trainer::detail {

namespace {

/// The literal starting at `column` of `line`: the characters `part` accepts, without the `_`
/// digit separators.
template <typename Part>
std::string literal_at(const std::string& line, std::size_t column, Part part) {
  std::string token;
  for (std::size_t i = column; i < line.size() && (line[i] == '_' || part(line[i], i == column)); ++i) {
    if (line[i] != '_') token += line[i];
  }
  return token;
}

}  // namespace

bool integer_literal_overflows(const std::string& line, std::size_t column) {
  std::string token = literal_at(line, column, [](char c, bool first) {
    return std::isalnum(static_cast<unsigned char>(c)) || (first && (c == '+' || c == '-'));
  });
  std::size_t at = 0;
  if (!token.empty() && (token[0] == '+' || token[0] == '-')) at = 1;
  int base = 10;
  if (token.size() > at + 1 && token[at] == '0' && std::isalpha(static_cast<unsigned char>(token[at + 1]))) {
    const char b = static_cast<char>(std::tolower(static_cast<unsigned char>(token[at + 1])));
    base = b == 'x' ? 16 : b == 'o' ? 8 : b == 'b' ? 2 : 10;
    token.erase(at, 2);
  }
  if (token.size() <= at) return false;
  errno = 0;
  (void)std::strtoll(token.c_str(), nullptr, base);
  return errno == ERANGE;
}

std::string float_literal_out_of_range(const std::string& line, std::size_t column) {
  const std::string token = literal_at(line, column, [](char c, bool) {
    return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
  });
  if (token.empty()) return {};
  errno = 0;
  const double x = std::strtod(token.c_str(), nullptr);
  if (errno != ERANGE) return {};
  if (std::fabs(x) >= 1.0) return token + " is outside the range of a float (a double: |x| <= 1.8e308)";
  if (x == 0.0) return token + " is too close to zero for a float (it reads as 0; |x| >= 2.2e-308 or exactly 0)";
  return {};  // a subnormal: validation says what is wrong with it
}

std::size_t first_invalid_utf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    const std::uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

std::string utf8_problem(const std::string& text, const std::string& source) {
  const std::size_t bad = first_invalid_utf8(text);
  if (bad == std::string::npos) return {};
  const std::size_t line_start = bad == 0 ? std::string::npos : text.rfind('\n', bad - 1);
  const std::size_t line = 1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + bad, '\n'));
  const std::size_t column = bad - (line_start == std::string::npos ? 0 : line_start + 1) + 1;
  return source + ":" + std::to_string(line) + ": invalid UTF-8 at column " + std::to_string(column) +
         " (TOML files are UTF-8 text)";
}

std::string format_double(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os << std::setprecision(17) << d;
  std::string s = os.str();
  // Shortest representation that round-trips; plain digits rather than an exponent for
  // magnitudes people write that way (30.0, not 3e+01). strtod, not stod: a subnormal reads
  // back with ERANGE, which stod would throw for.
  const bool plain = d == 0 || (std::fabs(d) >= 1e-4 && std::fabs(d) < 1e15);
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream t;
    t << std::setprecision(p) << d;
    if (std::strtod(t.str().c_str(), nullptr) == d && (!plain || t.str().find_first_of("eE") == std::string::npos)) {
      s = t.str();
      break;
    }
  }
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

}  // namespace trainer::detail
