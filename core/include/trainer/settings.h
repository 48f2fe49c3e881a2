#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "trainer/config.h"
#include "trainer/config_spec.h"

namespace trainer {

namespace detail {
template <typename T>
struct Optional {
  using type = T;
  static constexpr bool value = false;
};
template <typename T>
struct Optional<std::optional<T>> {
  using type = T;
  static constexpr bool value = true;
};
}  // namespace detail

/// The config value kind of a settings member's C++ type.
template <typename T>
constexpr ValueType setting_type() {
  if constexpr (std::is_same_v<T, std::int64_t>) return ValueType::Int;
  if constexpr (std::is_same_v<T, double>) return ValueType::Float;
  if constexpr (std::is_same_v<T, bool>) return ValueType::Bool;
  if constexpr (std::is_same_v<T, std::string>) return ValueType::String;
  if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) return ValueType::IntList;
  if constexpr (std::is_same_v<T, std::vector<double>>) return ValueType::FloatList;
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return ValueType::StringList;
}

/// Binds the members of a settings struct `S` to their config keys. One `add()` per key
/// names it once: the key, its doc and its rules (the KeySpec the validator, `trainer
/// plugins` and the README tables use) and the member it is read into. The default is the
/// member's own initialiser, so it is written once too; a `std::optional` member is a key
/// without a default (nullopt when absent).
template <typename S>
class SettingsSchema {
 public:
  /// Declares `key` for `member`; returns its KeySpec to add rules:
  /// `s.add(&S::lr, "lr", "Learning rate").min(0, false);`
  template <typename M>
  KeySpec& add(M S::*member, std::string key, std::string doc) {
    using T = typename detail::Optional<M>::type;  // a std::optional member: a key without default
    static_assert(std::is_same_v<T, std::int64_t> || std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                      std::is_same_v<T, std::string> || std::is_same_v<T, std::vector<std::int64_t>> ||
                      std::is_same_v<T, std::vector<double>> || std::is_same_v<T, std::vector<std::string>>,
                  "settings members are std::int64_t, double, bool, std::string, std::vectors of them, or "
                  "std::optionals of those");
    KeySpec spec(key, setting_type<T>(), std::move(doc));
    if constexpr (!detail::Optional<M>::value) {
      const S defaults{};
      spec.def(ConfigValue(defaults.*member));
    }
    readers_.push_back([member, key](S& s, const Config& section) {
      if (section.has(key)) s.*member = section.get<T>(key);
    });
    keys_.push_back(std::move(spec));
    return keys_.back();
  }

  /// Declares the keys of another settings struct `U` (a Settings<U>) in this section, read
  /// into `member`: keys shared by several components are declared once, in `U`.
  template <typename U>
  void include(U S::*member) {
    const auto more = U::keys();
    keys_.insert(keys_.end(), more.begin(), more.end());
    readers_.push_back([member](S& s, const Config& section) { s.*member = U::from(section); });
  }

  /// The keys, in declaration order.
  const std::vector<KeySpec>& keys() const { return keys_; }

  /// Reads `section` (a validated section, defaults filled in); a key it lacks keeps the
  /// member's default. A value of the wrong type throws ConfigError naming key and origin.
  S read(const Config& section) const {
    S s{};
    for (const auto& read : readers_) read(s, section);
    return s;
  }

 private:
  std::vector<KeySpec> keys_;
  std::vector<std::function<void(S&, const Config&)>> readers_;
};

/// Base of a typed settings struct (CRTP). `S` declares its members with their defaults and
/// a `static void declare(SettingsSchema<S>&)` binding each to its key; this base gives it
/// `keys()` (for config_keys(), registries and validation) and `from(section)`:
///
///   struct Settings : trainer::Settings<Settings> {
///     double factor = 0.5;
///     static void declare(trainer::SettingsSchema<Settings>& s) {
///       s.add(&Settings::factor, "factor", "Micro-batch multiplier after an OOM").min(0, false).max(1, false);
///     }
///   };
///   std::vector<KeySpec> config_keys() const override { return Settings::keys(); }
///   void configure(const Config& section, ...) override { settings_ = Settings::from(section); }
template <typename S>
struct Settings {
  /// The schema, built once from S::declare.
  static const SettingsSchema<S>& schema() {
    static const SettingsSchema<S> s = [] {
      SettingsSchema<S> built;
      S::declare(built);
      return built;
    }();
    return s;
  }
  static std::vector<KeySpec> keys() { return schema().keys(); }
  static S from(const Config& section) { return schema().read(section); }
};

}  // namespace trainer
