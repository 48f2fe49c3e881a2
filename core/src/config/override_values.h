#pragma once
// Private: what the reading of an override's value shares with the recipe's loader.
#include <optional>
#include <string>

namespace trainer::detail {

/// `["console", "early_stopping"]` for a bracketed `text` of bare words that lack TOML's quotes
/// (`[console,early_stopping]`), each word quoted that is not a TOML value by itself; nothing for
/// other text: a list with quotes, brackets or braces inside, or whose unparsable items look like
/// numbers (`[16 32]`, `[0.9,.95]`, a number out of range), keeps the error it has.
std::optional<std::string> quoted_list(const std::string& text);

}  // namespace trainer::detail
