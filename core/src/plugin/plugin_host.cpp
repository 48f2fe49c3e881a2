#include "trainer/plugin_host.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "trainer/config_spec.h"
#include "trainer/data.h"
#include "trainer/error.h"
#include "trainer/logging.h"
#include "trainer/model.h"
#include "trainer/optim.h"
#include "trainer/task.h"
#include "util/paths.h"

namespace fs = std::filesystem;

namespace trainer {

namespace {

// NOTE: libraries are kept until process exit on purpose. Objects, modules, autograd nodes
// and exceptions a plugin created can outlive every handle; once the last shared_library
// handle goes, the .so is really unmapped, and calling a plugin object, destroying an
// nn::Module subclass it defined or running backward() through its autograd Function then
// crashes. The list is leaked so no static destructor unloads it either.
struct LoadedLibraries {
  std::mutex mu;
  std::map<std::string, boost::dll::shared_library> by_path;
};
LoadedLibraries& loaded() {
  static auto* libs = new LoadedLibraries();
  return *libs;
}

const std::string kLibraryPrefix = "libtrainer_plugin_";

/// The plugin name of a library file name ("libtrainer_plugin_console.so" -> "console"), or "".
std::string plugin_name_of(const std::string& file_name) {
  if (file_name.rfind(kLibraryPrefix, 0) != 0 || file_name.size() <= kLibraryPrefix.size() + 3 ||
      file_name.compare(file_name.size() - 3, 3, ".so") != 0) {
    return {};
  }
  return file_name.substr(kLibraryPrefix.size(), file_name.size() - kLibraryPrefix.size() - 3);
}

}  // namespace

std::vector<std::string> default_plugin_dirs() {
  std::vector<std::string> dirs;
  const std::string core_dir = detail::core_library_dir();
#ifdef TRAINER_BUILD_CORE_DIR
  // The library of a build tree searches that tree's plugins only; an installed one searches
  // where it is installed, never a build directory that happens to be left over.
  std::error_code ec;
  if (!core_dir.empty() && fs::equivalent(core_dir, TRAINER_BUILD_CORE_DIR, ec)) {
    dirs.push_back(TRAINER_BUILD_PLUGIN_DIR);
    return dirs;
  }
#endif
  if (!core_dir.empty()) dirs.push_back(core_dir + "/trainer/plugins");
#ifdef TRAINER_INSTALL_PLUGIN_DIR
  if (std::find(dirs.begin(), dirs.end(), TRAINER_INSTALL_PLUGIN_DIR) == dirs.end()) {
    dirs.push_back(TRAINER_INSTALL_PLUGIN_DIR);
  }
#endif
  return dirs;
}

std::string PluginHost::library_file_name(const std::string& name) { return "libtrainer_plugin_" + name + ".so"; }

bool PluginHost::is_path(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 3 && s.compare(s.size() - 3, 3, ".so") == 0);
}

PluginHost::PluginHost(std::vector<std::string> extra_dirs) {
  for (auto& d : extra_dirs) dirs_.push_back(std::move(d));
  if (const char* env = std::getenv("TRAINER_PLUGIN_PATH")) {
    std::string cur;
    for (const char* p = env;; ++p) {
      if (*p == ':' || *p == '\0') {
        if (!cur.empty()) dirs_.push_back(cur);
        cur.clear();
        if (*p == '\0') break;
      } else {
        cur += *p;
      }
    }
  }
  for (auto& d : default_plugin_dirs()) {
    if (std::find(dirs_.begin(), dirs_.end(), d) == dirs_.end()) dirs_.push_back(d);
  }
}

std::string PluginHost::find(const std::string& name_or_path) const {
  if (is_path(name_or_path)) {
    if (fs::is_regular_file(name_or_path)) return fs::absolute(name_or_path).string();
    throw PluginError(fmt::format("plugin library '{}' not found", name_or_path));
  }
  const std::string file = library_file_name(name_or_path);
  for (const auto& d : dirs_) {
    const fs::path p = fs::path(d) / file;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return fs::absolute(p).string();
  }
  const std::vector<std::string> present = available();
  const std::string close = closest_match(name_or_path, present);
  throw PluginError(fmt::format(
      "plugin '{}' not found: looked for {} in {}{}{} (add a directory with plugins.path or $TRAINER_PLUGIN_PATH)",
      name_or_path, file, dirs_.empty() ? std::string("(no directories)") : fmt::to_string(fmt::join(dirs_, ", ")),
      close.empty() ? std::string() : "; did you mean '" + close + "'?",
      present.empty() ? std::string() : " (plugins there: " + fmt::to_string(fmt::join(present, ", ")) + ")"));
}

std::vector<std::string> PluginHost::available() const {
  std::vector<std::string> names;
  for (const auto& d : dirs_) {
    std::error_code ec;
    for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = plugin_name_of(it->path().filename().string());
      if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::shared_ptr<Plugin> PluginHost::load(const std::string& name_or_path) {
  const std::string path = find(name_or_path);
  auto& libs = loaded();
  std::lock_guard<std::mutex> lock(libs.mu);
  auto it = libs.by_path.find(path);
  if (it == libs.by_path.end()) {
    boost::dll::shared_library lib;
    try {
      lib.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
    } catch (const std::exception& e) {
      throw PluginError(fmt::format("cannot load plugin library {}: {}", path, e.what()));
    }
    if (!lib.has("trainer_plugin_abi") || !lib.has("trainer_plugin_create")) {
      throw PluginError(
          fmt::format("{} is not a trainer plugin: it does not export trainer_plugin_abi and trainer_plugin_create "
                      "(use TRAINER_PLUGIN(YourClass))",
                      path));
    }
    const AbiDescriptor theirs = lib.get_alias<PluginAbiFn>("trainer_plugin_abi")();
    const AbiDescriptor ours = this_abi();
    std::vector<std::string> mismatches;
    if (theirs.trainer_abi != ours.trainer_abi) {
      mismatches.push_back(fmt::format("trainer ABI {} (plugin) vs {} (host)", theirs.trainer_abi, ours.trainer_abi));
    }
    if (std::strncmp(theirs.torch_version, ours.torch_version, sizeof ours.torch_version) != 0) {
      mismatches.push_back(fmt::format("LibTorch {} (plugin) vs {} (host)",
                                       std::string(theirs.torch_version, strnlen(theirs.torch_version, 32)),
                                       ours.torch_version));
    }
    if (theirs.cxx11_abi != ours.cxx11_abi) {
      mismatches.push_back(
          fmt::format("_GLIBCXX_USE_CXX11_ABI {} (plugin) vs {} (host)", theirs.cxx11_abi, ours.cxx11_abi));
    }
    // Only comparable when the versions agree (an older descriptor has no sizes).
    for (std::size_t i = 0; mismatches.empty() && i < kAbiStructCount; ++i) {
      if (theirs.struct_sizes[i] != ours.struct_sizes[i]) {
        mismatches.push_back(fmt::format("sizeof({}) {} (plugin) vs {} (host); was TRAINER_ABI_VERSION not bumped?",
                                         kAbiStructNames[i], theirs.struct_sizes[i], ours.struct_sizes[i]));
      }
    }
    if (!mismatches.empty()) {
      throw PluginError(
          fmt::format("refusing plugin {}: built for a different host: {}. Rebuild the plugin against this trainer.",
                      path, fmt::join(mismatches, "; ")));
    }
    if (std::strncmp(theirs.compiler, ours.compiler, sizeof ours.compiler) != 0) {
      default_logger()->warn("plugin {} was built with {}, trainer with {}", path,
                             std::string(theirs.compiler, strnlen(theirs.compiler, sizeof theirs.compiler)),
                             ours.compiler);
    }
    it = libs.by_path.emplace(path, std::move(lib)).first;
  }
  Plugin* raw = nullptr;
  try {
    raw = it->second.get_alias<PluginCreateFn>("trainer_plugin_create")();
  } catch (const std::exception& e) {
    throw PluginError(fmt::format("plugin {}: trainer_plugin_create threw: {}", path, e.what()));
  } catch (...) {
    throw PluginError(
        fmt::format("plugin {}: trainer_plugin_create threw an exception that is not a std::exception", path));
  }
  if (!raw) throw PluginError(fmt::format("plugin {}: trainer_plugin_create returned null", path));
  return std::shared_ptr<Plugin>(raw);
}

namespace {

/// Every registry's entries, as "kind name" → the entry.
std::map<std::string, RegisteredEntry> registered_entries() {
  std::map<std::string, RegisteredEntry> out;
  const auto add = [&out](const auto& registry) {
    for (const auto& name : registry.names()) {
      const auto e = registry.get(name);
      out[registry.kind() + " " + name] = RegisteredEntry{registry.kind(), name, e.doc, e.keys};
    }
  };
  add(model_registry());
  add(dataset_registry());
  add(optimizer_registry());
  add(schedule_registry());
  add(task_registry());
  return out;
}

}  // namespace

std::vector<PluginInfo> PluginHost::discover(std::vector<std::string>* errors) {
  std::vector<PluginInfo> out;
  std::vector<std::string> seen;
  for (const auto& d : dirs_) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d, ec)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& p : files) {
      const std::string name = plugin_name_of(p.filename().string());
      if (name.empty()) continue;
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
      seen.push_back(name);
      try {
        // What creating the plugin adds to the registries is its own (a plugin registers its
        // components when it is created).
        const auto before = registered_entries();
        auto plugin = load(p.string());
        std::vector<RegisteredEntry> added;
        for (auto& [key, entry] : registered_entries()) {
          if (before.count(key) == 0) added.push_back(entry);
        }
        out.push_back({plugin->name(), plugin->version(), plugin->description(), p.string(), plugin->events(),
                       plugin->config_keys(), added});
      } catch (const std::exception& e) {
        if (errors) errors->push_back(e.what());
      }
    }
  }
  return out;
}

}  // namespace trainer
