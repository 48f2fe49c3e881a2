#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
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

/// What a `--resume` restored, for the Resume event.
struct ResumeInfo {
  std::string checkpoint;  ///< the file loaded
  std::int64_t epoch = 0;            ///< the epoch training continues in
  std::int64_t sample_in_epoch = 0;  ///< samples of that epoch already consumed
  std::int64_t global_step = 0;      ///< optimizer steps done before the resume
  /// Plugins of this run whose saved state was handed to load_state(), in dispatch order.
  std::vector<std::string> restored_plugins;
  /// Plugins of this run that the checkpoint holds no state for (they start afresh).
  std::vector<std::string> plugins_without_state;
};

}  // namespace trainer
