#pragma once
#include <memory>
#include <string>
#include <vector>

#include "trainer/export.h"
#include "trainer/plugin.h"

namespace trainer {

/// An entry a plugin added to one of the registries when it was created (a model, dataset,
/// optimizer, schedule or task of its own), with the keys it declared for its section.
struct RegisteredEntry {
  std::string kind;  ///< the registry's: "model", "dataset", "optimizer", "schedule", "task"
  std::string name;
  std::string doc;
  std::vector<KeySpec> keys;
};

/// What `trainer plugins` shows about one plugin library.
struct PluginInfo {
  std::string name;
  std::string version;
  std::string description;
  std::string path;
  std::vector<Event> events;
  std::vector<KeySpec> keys;
  std::vector<RegisteredEntry> registers;  ///< registry entries its creation added
};

/// Finds and loads plugin libraries (`libtrainer_plugin_<name>.so`) with Boost.DLL.
///
/// Search order: the directories given to the constructor (the recipe's `plugins.path`),
/// then `$TRAINER_PLUGIN_PATH` (colon-separated), then default_plugin_dirs(). Before creating anything the host reads
/// the library's AbiDescriptor and refuses a mismatch with a message naming the library and both versions.
///
/// Lifetime: a loaded library is never unloaded before process exit (objects, modules and
/// autograd nodes it created may outlive any handle).
class TRAINER_API PluginHost {
 public:
  explicit PluginHost(std::vector<std::string> extra_dirs = {});

  /// The directories searched, in order.
  const std::vector<std::string>& search_path() const { return dirs_; }

  /// Loads plugin `name` (or a path to a .so) and creates one instance. Throws PluginError:
  /// "not found" lists every directory searched; an ABI mismatch names both versions.
  std::shared_ptr<Plugin> load(const std::string& name_or_path);

  /// Resolves `name_or_path` to a library file; throws PluginError when not found (with the
  /// closest name among the libraries present as a did-you-mean).
  std::string find(const std::string& name_or_path) const;

  /// The names of the plugin libraries present in the searched directories, sorted.
  std::vector<std::string> available() const;

  /// Every plugin library found on the search path (first hit per name), loaded and
  /// described. Libraries that fail to load are returned in `errors`.
  std::vector<PluginInfo> discover(std::vector<std::string>* errors = nullptr);

  /// The file name of plugin `name`: "libtrainer_plugin_<name>.so".
  static std::string library_file_name(const std::string& name);

  /// Whether `name_or_path` (a plugins.load entry) is a library's path, loaded as it is: it has
  /// a '/' or ends in ".so". Otherwise it is a plugin's name, searched in the directories.
  static bool is_path(const std::string& name_or_path);

 private:
  std::vector<std::string> dirs_;
};

/// Where plugins are searched by default. libtrainer_core in its build tree: that tree's
/// plugin directory only. Installed: `<libdir>/trainer/plugins` beside the library, then the
/// configured install prefix's.
TRAINER_API std::vector<std::string> default_plugin_dirs();

}  // namespace trainer
