#include "trainer/plugin_state.h"

#include "trainer/error.h"

#include <fmt/format.h>

namespace trainer {

namespace {

const char* type_name(const PluginState::Value& v) {
  switch (v.index()) {
    case 0:
      return "an integer";
    case 1:
      return "a float";
    case 2:
      return "a boolean";
    case 3:
      return "a string";
    default:
      return "a tensor";
  }
}

/// The value of `key` as T, `fallback` when absent; an error naming the key when it holds
/// another type.
template <typename T>
T get_as(const std::map<std::string, PluginState::Value>& values, const std::string& key, const T& fallback,
         const char* wanted) {
  const auto it = values.find(key);
  if (it == values.end()) return fallback;
  if (const T* v = std::get_if<T>(&it->second)) return *v;
  throw Error(fmt::format("plugin state '{}' holds {}, read as {}", key, type_name(it->second), wanted));
}

}  // namespace

std::vector<std::string> PluginState::keys() const {
  std::vector<std::string> out;
  for (const auto& kv : values_) out.push_back(kv.first);
  return out;
}

std::int64_t PluginState::get_int(const std::string& key, std::int64_t fallback) const {
  return get_as<std::int64_t>(values_, key, fallback, "an integer");
}
double PluginState::get_double(const std::string& key, double fallback) const {
  return get_as<double>(values_, key, fallback, "a float");
}
bool PluginState::get_bool(const std::string& key, bool fallback) const {
  return get_as<bool>(values_, key, fallback, "a boolean");
}
std::string PluginState::get_string(const std::string& key, const std::string& fallback) const {
  return get_as<std::string>(values_, key, fallback, "a string");
}
at::Tensor PluginState::get_tensor(const std::string& key) const {
  return get_as<at::Tensor>(values_, key, at::Tensor(), "a tensor");
}

}  // namespace trainer
