#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "trainer/export.h"

namespace trainer {

/// What a plugin keeps across a resume (Lightning's state_dict): named values written into
/// every checkpoint of the run under the plugin's name, and handed back to the plugin's
/// load_state() when `--resume` loads that checkpoint. Keys are the plugin's own; a value
/// read with another type than it was written with is an error naming the key.
class TRAINER_API PluginState {
 public:
  using Value = std::variant<std::int64_t, double, bool, std::string, at::Tensor>;

  void set_int(const std::string& key, std::int64_t v) { values_[key] = v; }
  void set_double(const std::string& key, double v) { values_[key] = v; }
  void set_bool(const std::string& key, bool v) { values_[key] = v; }
  void set_string(const std::string& key, std::string v) { values_[key] = std::move(v); }
  /// Saved as it is (device and dtype); a resume loads it onto the run's device.
  void set_tensor(const std::string& key, at::Tensor v) { values_[key] = std::move(v); }

  bool has(const std::string& key) const { return values_.count(key) != 0; }
  bool empty() const { return values_.empty(); }
  std::vector<std::string> keys() const;

  /// The value of `key`, or `fallback` when there is none. Throws trainer::Error when it
  /// holds another type.
  std::int64_t get_int(const std::string& key, std::int64_t fallback = 0) const;
  double get_double(const std::string& key, double fallback = 0.0) const;
  bool get_bool(const std::string& key, bool fallback = false) const;
  std::string get_string(const std::string& key, const std::string& fallback = {}) const;
  at::Tensor get_tensor(const std::string& key) const;  ///< undefined tensor when none

  /// Every value, for the core's checkpoint code.
  const std::map<std::string, Value>& values() const { return values_; }
  void set(const std::string& key, Value v) { values_[key] = std::move(v); }

 private:
  std::map<std::string, Value> values_;
};

/// A plugin's saved members, each named once: save() writes them all into a PluginState,
/// load() reads them all back (a key the state lacks gives the type's zero value, as
/// PluginState's getters do). Bind them in one function both use:
///
///   trainer::StateFields fields() { return trainer::StateFields().add("wait", wait_).add("best", best_); }
///   void save_state(trainer::PluginState& s) override { fields().save(s); }
///   void load_state(const trainer::PluginState& s) override { fields().load(s); }
class StateFields {
 public:
  StateFields& add(std::string key, std::int64_t& v) { return bind(std::move(key), &v); }
  StateFields& add(std::string key, double& v) { return bind(std::move(key), &v); }
  StateFields& add(std::string key, bool& v) { return bind(std::move(key), &v); }
  StateFields& add(std::string key, std::string& v) { return bind(std::move(key), &v); }

  void save(PluginState& state) const {
    for (const auto& [key, member] : fields_) {
      std::visit([&, k = key](auto* p) { state.set(k, PluginState::Value(*p)); }, member);
    }
  }
  /// Throws trainer::Error when a key holds another type than its member.
  void load(const PluginState& state) const {
    for (const auto& [key, member] : fields_) {
      std::visit(
          [&, k = key](auto* p) {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, std::int64_t>) *p = state.get_int(k);
            if constexpr (std::is_same_v<T, double>) *p = state.get_double(k);
            if constexpr (std::is_same_v<T, bool>) *p = state.get_bool(k);
            if constexpr (std::is_same_v<T, std::string>) *p = state.get_string(k);
          },
          member);
    }
  }

 private:
  using Member = std::variant<std::int64_t*, double*, bool*, std::string*>;
  template <typename T>
  StateFields& bind(std::string key, T* v) {
    fields_.emplace_back(std::move(key), Member(v));
    return *this;
  }
  std::vector<std::pair<std::string, Member>> fields_;
};

/// What a `--resume` restored, for the Resume event.
struct ResumeInfo {
  std::string checkpoint;            ///< the file loaded
  std::int64_t epoch = 0;            ///< the epoch training continues in
  std::int64_t sample_in_epoch = 0;  ///< samples of that epoch already consumed
  std::int64_t global_step = 0;      ///< optimizer steps done before the resume
  /// Plugins of this run whose saved state was handed to load_state(), in dispatch order.
  std::vector<std::string> restored_plugins;
  /// Plugins of this run that the checkpoint holds no state for (they start afresh).
  std::vector<std::string> plugins_without_state;
};

}  // namespace trainer
