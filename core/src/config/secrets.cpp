// The config as a run writes it: secrets left out (trainer/secrets.h).
#include "trainer/secrets.h"

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

}  // namespace trainer
