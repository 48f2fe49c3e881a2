// The config as a run writes it: secrets left out (trainer/secrets.h).
#include "trainer/secrets.h"

#include <algorithm>
#include <cctype>
#include <variant>
#include <vector>

namespace trainer {

Config redacted(const Config& cfg) {
  Config out = cfg.clone();
  for (const auto& key : cfg.leaf_keys()) {
    if (is_secret_key(key)) {
      out.erase(key);
      continue;
    }
    const ConfigValue& v = cfg.value(key);
    if (const auto* s = std::get_if<std::string>(&v)) {
      if (const std::string cut = without_userinfo(*s); cut != *s) out.set(key, cut, cfg.origin(key));
    } else if (const auto* list = std::get_if<std::vector<std::string>>(&v)) {
      std::vector<std::string> cut;
      for (const auto& item : *list) cut.push_back(without_userinfo(item));
      if (cut != *list) out.set(key, cut, cfg.origin(key));
    }
  }
  return out;
}

namespace {

constexpr std::string_view kLeftOut = ": left out (a secret)";

/// A dotted key of letters, digits, '_' and '-' (each part starting with a letter or '_').
bool is_dotted_name(std::string_view key) {
  if (key.empty() || key.size() > 1000) return false;
  bool part_start = true;
  for (const char c : key) {
    const bool letter = std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_';
    if (part_start) {
      if (!letter) return false;
      part_start = false;
    } else if (c == '.') {
      part_start = true;
    } else if (!letter && std::isdigit(static_cast<unsigned char>(c)) == 0 && c != '-') {
      return false;
    }
  }
  return !part_start;
}

}  // namespace

std::string run_config_toml(const Config& cfg) {
  std::string text;
  for (const auto& key : cfg.leaf_keys()) {
    if (!is_secret_key(key)) continue;
    // A quoted TOML key may hold anything, a line break too: only a plain name goes in a comment.
    text += is_dotted_name(key)
                ? "# " + key + std::string(kLeftOut) + "; give it again on the command line: " + key + "=VALUE\n"
                : "# a key whose name is not a plain dotted name was left out (a secret)\n";
  }
  Config written = redacted(cfg);
  // A `defaults` list names groups to resolve. prepare_run resolved them and validation refuses
  // the key, so only a config given to a Trainer unvalidated has one, and the Trainer resolved
  // nothing of it; a stored config may not have one (refuse_stored_code_paths).
  written.erase("defaults");
  if (!text.empty()) text += "\n";
  return text + written.to_toml();
}

std::vector<std::string> secrets_left_out(std::string_view config_toml) {
  std::vector<std::string> keys;
  while (!config_toml.empty()) {
    const std::size_t end = config_toml.find('\n');
    std::string_view line = config_toml.substr(0, end);
    config_toml.remove_prefix(end == std::string_view::npos ? config_toml.size() : end + 1);
    if (line.substr(0, 2) != "# ") continue;
    const std::size_t at = line.find(kLeftOut);
    if (at == std::string_view::npos) continue;
    const std::string key(line.substr(2, at - 2));
    if (!is_dotted_name(key) || !is_secret_key(key)) continue;
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  return keys;
}

}  // namespace trainer
