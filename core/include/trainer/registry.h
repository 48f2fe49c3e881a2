#pragma once
#include <fmt/ranges.h>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "trainer/config_spec.h"
#include "trainer/error.h"

namespace trainer {

/// A name → factory map for one extension kind (models, datasets, optimizers, schedules).
/// Each entry declares its config keys so the validator knows them. Lookups of an unknown
/// name throw ConfigError listing the known names. Thread-safe.
template <typename Factory>
class Registry {
 public:
  struct Entry {
    Factory factory;
    std::vector<KeySpec> keys;  ///< keys of the section besides `name`
    std::string doc;
  };

  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  /// Registers (or replaces) `name`.
  void add(const std::string& name, Factory factory, std::vector<KeySpec> keys = {}, std::string doc = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_[name] = Entry{std::move(factory), std::move(keys), std::move(doc)};
  }

  bool contains(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.count(name) != 0;
  }

  /// The entry for `name`; throws ConfigError naming the known ones.
  Entry get(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      throw ConfigError({fmt::format("unknown {} '{}'; known: {}", kind_, name, fmt::join(names_locked(), ", "))});
    }
    return it->second;
  }

  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mu_);
    return names_locked();
  }

  const std::string& kind() const { return kind_; }

 private:
  std::vector<std::string> names_locked() const {
    std::vector<std::string> out;
    for (const auto& kv : entries_) out.push_back(kv.first);
    return out;
  }
  std::string kind_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

}  // namespace trainer
