// The value of a command-line override (`key=value`): TOML when it parses, else the text
// itself, with the errors of numbers TOML cannot hold and of lists whose words lost their
// quotes (trainer/recipe.h).
#include "config/override_values.h"

#include <fmt/ranges.h>

#include <cctype>
#include <limits>
#include <regex>
#include <sstream>
#include <vector>

#include "config/config_numbers.h"
#include "trainer/error.h"
#include "trainer/recipe.h"

namespace trainer {

namespace detail {

std::optional<std::string> quoted_list(const std::string& text) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
  const std::string inner = text.substr(1, text.size() - 2);
  if (inner.find_first_of("\"'[]{}\\") != std::string::npos) return std::nullopt;
  std::vector<std::string> items;
  bool bare = false;
  std::string item;
  std::istringstream in(inner);
  while (std::getline(in, item, ',')) {
    const auto first = item.find_first_not_of(" \t"), last = item.find_last_not_of(" \t");
    if (first == std::string::npos) return std::nullopt;
    item = item.substr(first, last - first + 1);
    bool value = true;
    try {
      Config::parse("v = " + item, "override");
    } catch (const ConfigError&) {
      value = false;
    }
    if (!value) {
      const char c = item.front();
      if (std::isdigit(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.') return std::nullopt;
      bare = true;
      item = "\"" + item + "\"";
    }
    items.push_back(item);
  }
  if (!bare) return std::nullopt;
  return "[" + fmt::format("{}", fmt::join(items, ", ")) + "]";
}

}  // namespace detail

ConfigValue parse_override_value(const std::string& text) {
  try {
    Config c = Config::parse("v = " + text, "override");
    if (c.has("v") && !c.is_table("v")) return c.value("v");
  } catch (const ConfigError&) {
    // A list whose words lack their quotes, `plugins.load=[console,early_stopping]`: TOML's
    // strings need them, and the shell takes those off unless the value is in single quotes.
    if (const auto quoted = detail::quoted_list(text)) {
      throw ConfigError(
          {fmt::format("{} is not a TOML list: its words need quotes, {} (a string that starts with '[' "
                       "is written in quotes, inside single ones on the command line: '\"{}\"')",
                       text, *quoted, text)});
    }
    // Not TOML: a bare string such as `run.name=baseline` or `dataset.root=/data/x`, unless
    // it is written as a number that TOML cannot hold.
    // (`007` is not a TOML number either, and stays the string "007".)
    static const std::regex integer(R"([+-]?[0-9][0-9_]*)");
    static const std::regex floating(R"([+-]?[0-9][0-9_]*(\.[0-9_]+)?([eE][+-]?[0-9]+)?)");
    if (std::regex_match(text, integer) && detail::integer_literal_overflows(text, 0)) {
      throw ConfigError(
          {fmt::format("{} is outside the integer range [{}, {}]", text, std::numeric_limits<std::int64_t>::min(),
                       std::numeric_limits<std::int64_t>::max())});
    }
    if (std::regex_match(text, floating)) {
      if (const std::string bad = detail::float_literal_out_of_range(text, 0); !bad.empty()) throw ConfigError({bad});
    }
  }
  return text;
}

}  // namespace trainer
