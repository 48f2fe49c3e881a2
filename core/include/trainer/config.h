#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "trainer/export.h"

namespace trainer {

namespace detail {
struct ConfigNode;
}

/// A scalar or list config value. Tables are Config objects.
using ConfigValue = std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>,
                                 std::vector<double>, std::vector<std::string>>;

/// The type names used in messages: "integer", "float", "bool", "string", "integer list", ...
TRAINER_API std::string config_value_type_name(const ConfigValue& v);
/// TOML text of a value (`3`, `0.001`, `"cnn"`, `[32, 64]`).
TRAINER_API std::string config_value_to_toml(const ConfigValue& v);

/// The resolved configuration of a run: a tree of tables keyed by dotted paths
/// (`training.batch_size`). Every leaf remembers where it came from (`file:line` or the
/// command-line override) so errors can name it. toml11 stays behind this class.
///
/// Copies share the tree (cheap); `sub()` returns a view of a subtree. Not thread-safe for
/// concurrent mutation; concurrent reads are fine.
class TRAINER_API Config {
 public:
  /// An empty table.
  Config();

  /// Parses TOML text; `source` names it in messages. Throws ConfigError on syntax errors.
  static Config parse(const std::string& toml_text, const std::string& source = "<string>");
  /// Parses a TOML file. Throws ConfigError (naming the file) when missing or malformed.
  static Config parse_file(const std::string& path);

  /// True when `key` (dotted) names a value or a table.
  bool has(const std::string& key) const;
  /// True when `key` names a table.
  bool is_table(const std::string& key) const;

  /// Typed access. Ints widen to double; anything else that does not match throws
  /// ConfigError naming the key, its origin, the expected and the actual type.
  template <typename T>
  T get(const std::string& key) const;
  /// Like get() but returns `fallback` when the key is absent.
  template <typename T>
  T get_or(const std::string& key, T fallback) const {
    return has(key) ? get<T>(key) : fallback;
  }
  /// The raw value; throws ConfigError when absent or a table.
  const ConfigValue& value(const std::string& key) const;

  /// Child key names of the table at `key` ("" = root), in sorted order.
  std::vector<std::string> keys(const std::string& table = "") const;
  /// Every leaf key below `table`, dotted, relative to this config's root.
  std::vector<std::string> leaf_keys(const std::string& table = "") const;
  /// View of the table at `key` (shares nodes; an empty table when absent).
  Config sub(const std::string& key) const;

  /// Where the value at `key` came from: "recipes/x.toml:12", "override 'a.b=1'", "default".
  std::string origin(const std::string& key) const;

  /// Sets a value, creating intermediate tables.
  void set(const std::string& key, ConfigValue value, const std::string& origin = "code");
  /// Removes a key (value or table). Returns false when it was absent.
  bool erase(const std::string& key);
  /// Deep-merges `other` into this config: tables merge, values replace.
  void merge(const Config& other);
  /// A deep copy that shares nothing with this config.
  Config clone() const;

  /// The resolved config as TOML (tables sorted, one `[section]` per table).
  std::string to_toml() const;

 private:
  explicit Config(std::shared_ptr<detail::ConfigNode> root);
  std::shared_ptr<detail::ConfigNode> root_;
  friend struct ConfigAccess;
};

}  // namespace trainer
