#include "trainer/recipe.h"

#include <fmt/ranges.h>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "config/override_values.h"
#include "trainer/data.h"
#include "trainer/error.h"
#include "trainer/model.h"
#include "trainer/optim.h"
#include "trainer/plugin.h"
#include "trainer/plugin_host.h"
#include "trainer/secrets.h"
#include "util/paths.h"

namespace fs = std::filesystem;

namespace trainer {

namespace {

bool valid_key(const std::string& key) {
  static const std::regex re(R"([A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*)");
  return std::regex_match(key, re);
}

std::vector<std::string> config_search_dirs(const std::string& recipe_path,
                                            const std::vector<std::string>& explicit_dirs, RecipeKind kind) {
  std::vector<std::string> dirs = explicit_dirs;
  // A run directory is data: no group is looked for beside the config.toml it stored.
  if (kind == RecipeKind::Recipe) {
    const fs::path recipe_dir = fs::absolute(recipe_path).parent_path();
    dirs.push_back((recipe_dir.parent_path() / "configs").lexically_normal().string());
    dirs.push_back((recipe_dir / "configs").lexically_normal().string());
  }
  if (const char* env = std::getenv("TRAINER_CONFIG_PATH")) {
    std::string s = env, cur;
    for (char c : s + ":") {
      if (c == ':') {
        if (!cur.empty()) dirs.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
  }
  // Installed layout: <prefix>/lib/libtrainer_core.so and <prefix>/share/trainer/configs (a
  // prefix moved elsewhere keeps finding its own). A build tree's library: the source tree's.
  const std::string lib_dir = detail::core_library_dir();
#if defined(TRAINER_BUILD_CORE_DIR) && defined(TRAINER_SOURCE_CONFIG_DIR)
  std::error_code ec;
  if (!lib_dir.empty() && fs::equivalent(lib_dir, TRAINER_BUILD_CORE_DIR, ec)) {
    dirs.push_back(TRAINER_SOURCE_CONFIG_DIR);
    return dirs;
  }
#endif
  if (!lib_dir.empty()) {
    const fs::path installed = fs::path(lib_dir).parent_path() / "share" / "trainer" / "configs";
    if (fs::is_directory(installed)) dirs.push_back(installed.string());
  }
#ifdef TRAINER_INSTALL_CONFIG_DIR
  dirs.push_back(TRAINER_INSTALL_CONFIG_DIR);
#endif
  return dirs;
}

/// A config group's name: "package/name" or a preset's "name", each part letters, digits, '_',
/// '-' and '.' (not "." or ".."), at most 100 bytes: never a path out of the config directories,
/// nor one the file system refuses.
bool is_group_name(const std::string& group) {
  const auto part_ok = [](const std::string& part) {
    if (part.empty() || part.size() > 100 || part == "." || part == "..") return false;
    return std::all_of(part.begin(), part.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-' || c == '.';
    });
  };
  const auto slash = group.find('/');
  if (slash == std::string::npos) return part_ok(group);
  return part_ok(group.substr(0, slash)) && part_ok(group.substr(slash + 1));
}

std::string find_group_file(const std::string& group, const std::vector<std::string>& dirs) {
  for (const auto& d : dirs) {
    const fs::path p = fs::path(d) / (group + ".toml");
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return {};
}

std::vector<std::string> group_options(const std::string& group_dir, const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  for (const auto& d : dirs) {
    const fs::path p = fs::path(d) / group_dir;
    std::error_code ec;
    if (!fs::is_directory(p, ec)) continue;
    for (auto it = fs::directory_iterator(p, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      if (it->path().extension() == ".toml") out.push_back(it->path().stem().string());
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool is_group_dir(const std::string& name, const std::vector<std::string>& dirs) {
  for (const auto& d : dirs) {
    std::error_code ec;
    if (fs::is_directory(fs::path(d) / name, ec)) return true;
  }
  return false;
}

/// A stored config's `defaults`, refused: what trainer writes is resolved, its groups merged,
/// and the group files would be looked for in and beside the run directory, which is data.
std::string stored_defaults_problem(const Config& stored) {
  return fmt::format(
      "{}: defaults names config groups; a stored config is already resolved (a run writes every key of its groups "
      "and no defaults), so it may not name any. Give groups with the recipe: trainer --recipe FILE --resume RUN_DIR",
      stored.origin("defaults"));
}

/// A stored config's keys say so in their origins ("runs/r/config.toml:41 (a stored config)"):
/// in messages, and to a plugin that must not act on what a run directory alone says (the
/// MLflow plugin sends the environment's credentials only to a server the user named).
void mark_stored(Config& stored) {
  for (const auto& key : stored.leaf_keys()) {
    stored.set(key, stored.value(key), stored.origin(key) + " (a stored config)");
  }
}

LoadedRecipe load_recipe_as(const std::string& recipe_path, const std::vector<std::string>& overrides,
                            const std::vector<std::string>& config_dirs, RecipeKind kind);

}  // namespace

Override parse_override(const std::string& typed) {
  // Messages and config origins show the override without a secret's value or a URI's credentials.
  const std::string text = redacted_override(typed);
  Override o;
  o.text = text;
  std::string body = typed;
  if (!body.empty() && body[0] == '+') {
    o.kind = Override::Kind::Add;
    body.erase(0, 1);
  }
  const auto eq = body.find('=');
  if (eq == std::string::npos) {
    if (o.kind == Override::Kind::Add || !valid_key(body) || body.find('.') != std::string::npos) {
      throw ConfigError(
          {fmt::format("override '{}': expected key=value, +key=value, group=option or a preset name", text)});
    }
    o.kind = Override::Kind::Preset;
    o.key = body;
    return o;
  }
  o.key = body.substr(0, eq);
  o.value = body.substr(eq + 1);
  if (!valid_key(o.key)) {
    throw ConfigError(
        {fmt::format("override '{}': '{}' is not a valid key (letters, digits, '_', '-', dotted)", text, o.key)});
  }
  if (o.value.empty()) {
    throw ConfigError({fmt::format("override '{}': missing value after '='", text)});
  }
  return o;
}

LoadedRecipe load_recipe(const std::string& recipe_path, const std::vector<std::string>& overrides,
                         const std::vector<std::string>& config_dirs) {
  return load_recipe_as(recipe_path, overrides, config_dirs, RecipeKind::Recipe);
}

namespace {

LoadedRecipe load_recipe_as(const std::string& recipe_path, const std::vector<std::string>& overrides,
                            const std::vector<std::string>& config_dirs, RecipeKind kind) {
  std::vector<std::string> problems;
  LoadedRecipe out;

  std::vector<Override> parsed;
  for (const auto& text : overrides) {
    try {
      parsed.push_back(parse_override(text));
    } catch (const ConfigError& e) {
      problems.insert(problems.end(), e.problems().begin(), e.problems().end());
    }
  }

  Config recipe = Config::parse_file(recipe_path);  // unreadable recipe: nothing else to say
  if (kind == RecipeKind::StoredConfig) mark_stored(recipe);
  const auto dirs = config_search_dirs(recipe_path, config_dirs, kind);

  // defaults = [...] with group selections and presets from the command line applied.
  std::vector<std::string> defaults;
  if (kind == RecipeKind::StoredConfig && recipe.has("defaults")) {
    // refuse_stored_code_paths refused it already, in what it read: the file may have changed since.
    problems.push_back(stored_defaults_problem(recipe));
  } else if (recipe.has("defaults")) {
    try {
      defaults = recipe.get<std::vector<std::string>>("defaults");
    } catch (const ConfigError& e) {
      problems.push_back(
          fmt::format("{}: defaults must be a list of group names such as [\"model/cnn\"]", recipe.origin("defaults")));
    }
  }
  // Each entry remembers who asked for it, for the "not found" message.
  std::vector<std::pair<std::string, std::string>> groups;  // (group, origin)
  const std::string defaults_origin = recipe.has("defaults") ? recipe.origin("defaults") : recipe_path;
  for (const auto& d : defaults) groups.emplace_back(d, defaults_origin);
  std::vector<std::pair<std::string, std::string>> presets;  // merged after the recipe
  for (auto& o : parsed) {
    if (o.kind == Override::Kind::Set && o.key.find('.') == std::string::npos && is_group_dir(o.key, dirs)) {
      o.kind = Override::Kind::Group;
    }
    const std::string origin = fmt::format("override '{}'", o.text);
    if (o.kind == Override::Kind::Group) {
      const std::string entry = o.key + "/" + o.value;
      bool replaced = false;
      for (auto& g : groups) {
        if (g.first.rfind(o.key + "/", 0) == 0) {
          g = {entry, origin};
          replaced = true;
        }
      }
      if (!replaced) groups.emplace_back(entry, origin);
    } else if (o.kind == Override::Kind::Preset) {
      presets.emplace_back(o.key, origin);
    }
  }

  // Layers merge key by key, the later winning, except `plugins.load`: a group or preset that
  // loads plugins adds them to the list (in order, without duplicates) instead of replacing
  // the plugins of the layers before it. An override `plugins.load=[...]` still replaces it.
  auto merge_layer = [](Config& into, const Config& layer) {
    const char* key = "plugins.load";
    std::vector<std::string> before;
    try {
      before = into.get_or<std::vector<std::string>>(key, {});
    } catch (const ConfigError&) {
      // A wrong type is reported by validation.
    }
    const std::string before_origin = into.has(key) ? into.origin(key) : "";
    into.merge(layer);
    if (before.empty() || !layer.has(key)) return;
    try {
      std::vector<std::string> list = before;
      for (const auto& p : layer.get<std::vector<std::string>>(key)) {
        if (std::find(list.begin(), list.end(), p) == list.end()) list.push_back(p);
      }
      into.set(key, list, before_origin + " + " + layer.origin(key));
    } catch (const ConfigError&) {
    }
  };

  // Group files are merged under their package (configs/model/x.toml -> [model]); a
  // top-level preset merges at the root.
  auto merge_group = [&](Config& into, const std::string& group, const std::string& origin) {
    if (!is_group_name(group)) {
      problems.push_back(fmt::format(
          "{}: '{}' is not a config group name (package/name or a preset's name: letters, digits, '_', '-', '.', at "
          "most 100 bytes each)",
          origin, group.size() <= 200 ? group : group.substr(0, 200) + "..."));
      return;
    }
    const std::string file = find_group_file(group, dirs);
    const auto slash = group.find('/');
    if (file.empty()) {
      std::string msg = fmt::format(
          "{}: config group '{}' not found; searched: {} (TRAINER_CONFIG_PATH, colon-separated, adds "
          "directories that hold <group>/<name>.toml files)",
          origin, group, fmt::join(dirs, ", "));
      if (slash != std::string::npos) {
        const auto opts = group_options(group.substr(0, slash), dirs);
        msg += fmt::format("; available for {}: {}", group.substr(0, slash),
                           opts.empty() ? std::string("none") : fmt::to_string(fmt::join(opts, ", ")));
      }
      problems.push_back(msg);
      return;
    }
    try {
      Config g = Config::parse_file(file);
      if (slash == std::string::npos) {
        merge_layer(into, g);
      } else {
        Config wrapped;
        const std::string package = group.substr(0, slash);
        for (const auto& k : g.leaf_keys()) wrapped.set(package + "." + k, g.value(k), g.origin(k));
        merge_layer(into, wrapped);
      }
      out.sources.push_back(file);
    } catch (const ConfigError& e) {
      problems.insert(problems.end(), e.problems().begin(), e.problems().end());
    }
  };

  Config merged;
  for (const auto& g : groups) merge_group(merged, g.first, g.second);
  recipe.erase("defaults");
  merge_layer(merged, recipe);
  out.sources.push_back(recipe_path);
  out.path = recipe_path;
  // Presets named on the command line are the user's latest word: they win over the recipe.
  for (const auto& p : presets) merge_group(merged, p.first, p.second);
  for (const auto& k : merged.leaf_keys()) out.file_keys.insert(k);

  for (const auto& o : parsed) {
    if (o.kind != Override::Kind::Set && o.kind != Override::Kind::Add) continue;
    const std::string origin = fmt::format("override '{}'", o.text);
    if (merged.is_table(o.key)) {
      problems.push_back(fmt::format("{}: '{}' is a table; set one of its keys ({})", origin, o.key,
                                     fmt::join(merged.keys(o.key), ", ")));
      continue;
    }
    try {
      merged.set(o.key, parse_override_value(o.value), origin);
    } catch (const ConfigError& e) {
      // The command line to write instead, where the shell took the words' quotes away.
      const auto quoted = detail::quoted_list(o.value);
      const std::string instead = quoted ? fmt::format("; on the command line, in single quotes: '{}{}={}'",
                                                       o.kind == Override::Kind::Add ? "+" : "", o.key, *quoted)
                                         : std::string();
      for (const auto& p : e.problems()) problems.push_back(fmt::format("{}: {}{}", origin, p, instead));
    }
  }
  out.overrides = std::move(parsed);
  out.config = merged;
  if (!problems.empty()) throw ConfigError(problems);
  return out;
}

}  // namespace

void validate_recipe(LoadedRecipe& recipe, const std::vector<SectionSpec>& extra) {
  Config& cfg = recipe.config;
  auto sections = core_config_sections(cfg);
  sections.insert(sections.end(), extra.begin(), extra.end());

  std::vector<std::string> problems;
  std::vector<std::string> known, loaded;
  for (const auto& s : sections) {
    for (const auto& k : s.keys) known.push_back(s.path + "." + k.key);
    if (s.path.rfind("plugins.", 0) == 0) loaded.push_back(s.path.substr(8));
  }
  // A `plugins.<name>` section of a plugin this run does not load is inert: kept, not checked
  // (leaving a plugin out of plugins.load switches it off without editing the recipe). One
  // that names no plugin library found is a typo, and an error.
  std::vector<std::string> open;
  recipe.inert_sections.clear();
  for (const auto& k : cfg.is_table("plugins") ? cfg.keys("plugins") : std::vector<std::string>{}) {
    const std::string path = "plugins." + k;
    if (!cfg.is_table(path) || std::find(loaded.begin(), loaded.end(), k) != loaded.end()) continue;
    open.push_back(path);
    const auto& libs = recipe.plugin_libraries;
    if (!libs || std::find(libs->begin(), libs->end(), k) != libs->end()) {
      recipe.inert_sections.push_back(path);
      continue;
    }
    std::vector<std::string> names = loaded;
    names.insert(names.end(), libs->begin(), libs->end());
    const std::string close = closest_match(k, names);
    const auto leaves = cfg.leaf_keys(path);
    problems.push_back(fmt::format("{}: [{}] configures plugin '{}', which is neither loaded nor found{}",
                                   leaves.empty() ? path : cfg.origin(leaves.front()), path, k,
                                   close.empty() ? "" : "; did you mean [plugins." + close + "]?"));
  }
  for (const auto& o : recipe.overrides) {
    if (std::any_of(open.begin(), open.end(), [&](const std::string& s) { return o.key.rfind(s + ".", 0) == 0; })) {
      continue;  // a key of a section that is not checked
    }
    const bool in_files = recipe.file_keys.count(o.key) != 0;
    const bool in_schema = std::find(known.begin(), known.end(), o.key) != known.end();
    if (o.kind == Override::Kind::Set && !in_files && !in_schema) {
      std::string msg = fmt::format("override '{}': no key '{}' in the recipe or its schema", o.text, o.key);
      msg += did_you_mean(o.key, known);
      problems.push_back(msg);
      cfg.erase(o.key);
    } else if (o.kind == Override::Kind::Add && in_files) {
      problems.push_back(fmt::format("override '{}': key '{}' already exists; use '{}' to change it", o.text, o.key,
                                     o.text.substr(1)));
    }
  }

  // A section whose `name` is not among its choices cannot say which keys it has: report
  // the name only (the name's KeySpec lists the registry's names).
  for (const auto& sec : sections) {
    const std::string key = sec.path + ".name";
    const auto spec = std::find_if(sec.keys.begin(), sec.keys.end(), [](const KeySpec& k) { return k.key == "name"; });
    if (spec == sec.keys.end() || spec->allowed.empty() || !cfg.has(key) || cfg.is_table(key)) continue;
    const auto* v = std::get_if<std::string>(&cfg.value(key));
    if (!v || std::find(spec->allowed.begin(), spec->allowed.end(), *v) != spec->allowed.end()) continue;
    for (const auto& k : cfg.keys(sec.path)) {
      if (k != "name") open.push_back(sec.path + "." + k);
    }
  }

  // [sweep] belongs to `trainer sweep`, which reads and checks it before this; a trial, and any
  // run of the recipe, is the recipe without it.
  open.push_back("sweep");
  auto more = validate_config(cfg, sections, open);
  cfg.erase("sweep");
  if (!more.empty() && recipe.file_keys.empty() && !recipe.path.empty()) {
    problems.push_back(
        fmt::format("{}: the recipe is empty; it needs at least model.name and dataset.name "
                    "(recipes/fashion_mnist.toml is a complete example)",
                    recipe.path));
  }
  // A missing key has no origin of its own: the recipe is where it is missing.
  for (auto& p : more) {
    problems.push_back(p.rfind("missing required key", 0) == 0 && !recipe.path.empty() ? recipe.path + ": " + p
                                                                                       : std::move(p));
  }

  if (!problems.empty()) throw ConfigError(problems);
}

std::vector<SectionSpec> plugin_config_sections(const std::vector<std::shared_ptr<Plugin>>& plugins) {
  std::vector<SectionSpec> out;
  for (const auto& p : plugins) {
    SectionSpec s{"plugins." + p->name(), p->config_keys(), p->description()};
    for (const auto& k : PluginDispatch::keys()) s.keys.push_back(k);
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

std::string normal_path(const std::string& p) { return fs::absolute(p).lexically_normal().string(); }

/// A stored `key`'s entries that are paths (every entry of plugins.path, the library paths of
/// plugins.load), or none when its type is wrong (validate_recipe says so).
std::vector<std::string> stored_paths(const Config& stored, const std::string& key) {
  std::vector<std::string> entries;
  try {
    entries = stored.get_or<std::vector<std::string>>(key, {});
  } catch (const ConfigError&) {
    return {};
  }
  if (key == "plugins.load") {
    entries.erase(std::remove_if(entries.begin(), entries.end(), [](const auto& e) { return !PluginHost::is_path(e); }),
                  entries.end());
  }
  return entries;
}

/// What a stored config's key `key` names that runs code: the TorchScript file of model.path
/// (model "torchscript") or task.loss_path; none otherwise.
std::optional<std::string> stored_script(const Config& stored, const std::string& key) {
  try {
    if (key == "model.path" && stored.get_or<std::string>("model.name", "") != "torchscript") return std::nullopt;
    const std::string path = stored.get_or<std::string>(key, "");
    if (!path.empty()) return path;
  } catch (const ConfigError&) {
    // Wrong types are reported by validate_recipe.
  }
  return std::nullopt;
}

/// What the user's command line gives: the keys its overrides set (`key=value`, `+key=value`:
/// their stored values are not used) and the paths it names to load plugins from (each
/// --plugin-dir, the entries of its plugins.load and plugins.path overrides), normalized.
struct CommandLine {
  std::set<std::string> keys, paths;
};

CommandLine command_line(const std::vector<std::string>& overrides, const std::vector<std::string>& plugin_dirs) {
  CommandLine out;
  for (const auto& d : plugin_dirs) out.paths.insert(normal_path(d));
  for (const auto& text : overrides) {
    const Override o = parse_override(text);
    if (o.kind != Override::Kind::Set && o.kind != Override::Kind::Add) continue;
    out.keys.insert(o.key);
    if (o.key != "plugins.load" && o.key != "plugins.path") continue;
    const ConfigValue value = parse_override_value(o.value);
    if (const auto* list = std::get_if<std::vector<std::string>>(&value)) {
      for (const auto& e : *list) out.paths.insert(normal_path(e));
    }
  }
  return out;
}

/// One problem for each path to code that `cfg` names and `user` does not give: library paths
/// and directories of plugins.load and plugins.path, the TorchScript files of model.path (model
/// "torchscript") and task.loss_path. Each names where its value came from (the key's origin:
/// the stored file's line, or a preset's), the key, the path and how to give it.
std::vector<std::string> code_path_problems(const Config& cfg, const CommandLine& user) {
  std::vector<std::string> problems;
  for (const std::string key : {"plugins.load", "plugins.path"}) {
    if (user.keys.count(key) != 0) continue;  // the command line's value replaced it
    for (const auto& path : stored_paths(cfg, key)) {
      if (user.paths.count(normal_path(path)) != 0) continue;
      problems.push_back(fmt::format(
          "{}: {} names the path '{}'; a stored config may name plugins, not paths (a run directory is data, and "
          "loading a library runs its code). If you mean to load it, give it on the command line: {}",
          cfg.origin(key), key, path,
          key == "plugins.path" ? "--plugin-dir " + path
                                : "'plugins.load=[\"" + path + "\", ...]' (the list as you want it)"));
    }
  }
  for (const std::string key : {"model.path", "task.loss_path"}) {
    if (user.keys.count(key) != 0) continue;
    if (const auto path = stored_script(cfg, key)) {
      problems.push_back(fmt::format(
          "{}: {} names the TorchScript file '{}'; a stored config may not name code to run (a run directory is "
          "data, and loading a TorchScript module runs its code). If you mean to run it, give it on the command "
          "line: {}={}",
          cfg.origin(key), key, *path, key, *path));
    }
  }
  return problems;
}

/// The notes of a resume from `stored_config` for the keys it left out as secrets
/// (run_config_toml's comments) that nothing gives again (`given`: the keys of the overrides and
/// of the files merged, presets named on the command line among them): the run goes on without them.
std::vector<std::string> secrets_notes(const std::string& stored_config, const std::set<std::string>& given) {
  std::ifstream in(stored_config, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();  // read a moment ago by load_recipe_as; unreadable now: no comments to read
  std::vector<std::string> notes;
  for (const auto& key : secrets_left_out(text.str())) {
    if (given.count(key) != 0) continue;
    notes.push_back(fmt::format(
        "{}: {} was left out of it (a secret: a run writes none down), so this run goes on without it (with its "
        "default, if it has one); to resume with it, give it again on the command line: {}=VALUE",
        stored_config, key, key));
  }
  return notes;
}

}  // namespace

void refuse_stored_code_paths(const std::string& stored_config, const std::vector<std::string>& overrides,
                              const std::vector<std::string>& plugin_dirs) {
  const Config stored = Config::parse_file(stored_config);
  std::vector<std::string> problems;
  if (stored.has("defaults")) problems.push_back(stored_defaults_problem(stored));
  for (auto& p : code_path_problems(stored, command_line(overrides, plugin_dirs))) problems.push_back(std::move(p));
  if (!problems.empty()) throw ConfigError(problems);
}

PreparedRun prepare_run(const std::string& recipe, const std::vector<std::string>& overrides,
                        const std::vector<std::string>& plugin_dirs, RecipeKind kind) {
  const bool stored = kind == RecipeKind::StoredConfig;
  if (stored) refuse_stored_code_paths(recipe, overrides, plugin_dirs);
  LoadedRecipe loaded = load_recipe_as(recipe, overrides, {}, kind);
  if (stored) {
    // Again on what it resolved to, before any library is loaded: presets named on the command
    // line merge over it, and what they name is checked as the stored file's own keys are (so is
    // the stored file, read again: it may have changed since it was checked).
    const auto problems = code_path_problems(loaded.config, command_line(overrides, plugin_dirs));
    if (!problems.empty()) throw ConfigError(problems);
  }
  std::vector<std::string> dirs = plugin_dirs;
  std::vector<std::string> names;
  try {
    for (auto& d : loaded.config.get_or<std::vector<std::string>>("plugins.path", {})) dirs.push_back(d);
    names = loaded.config.get_or<std::vector<std::string>>("plugins.load", {});
  } catch (const ConfigError&) {
    // Wrong types here are reported by validate_recipe below.
  }
  PluginHost host(dirs);
  PreparedRun out;
  const std::string listed_in = loaded.config.has("plugins.load") ? loaded.config.origin("plugins.load") : recipe;
  std::vector<std::string> entries;  // the entry of plugins.load each plugin came from
  for (const auto& name : names) {
    std::shared_ptr<Plugin> plugin;
    try {
      plugin = host.load(name);
    } catch (const PluginError& e) {
      throw PluginError(fmt::format("{}: plugins.load entry '{}': {}", listed_in, name, e.what()));
    }
    for (std::size_t i = 0; i < out.plugins.size(); ++i) {
      TRAINER_CHECK_T(UsageError, out.plugins[i]->name() != plugin->name(), listed_in, ": plugins.load lists plugin '",
                      plugin->name(), "' twice, as '", entries[i], "' and as '", name,
                      "'; list it once (two instances would each act on every event)");
    }
    out.plugins.push_back(std::move(plugin));
    entries.push_back(name);
  }
  loaded.plugin_libraries = host.available();
  validate_recipe(loaded, plugin_config_sections(out.plugins));
  out.config = loaded.config;
  out.sources = loaded.sources;
  for (const auto& path : loaded.inert_sections) {
    out.notes.push_back(fmt::format("[{}] is inert: plugin '{}' is not in plugins.load", path, path.substr(8)));
  }
  if (stored) {
    std::set<std::string> given = loaded.file_keys;
    for (const auto& o : loaded.overrides) {
      if (o.kind == Override::Kind::Set || o.kind == Override::Kind::Add) given.insert(o.key);
    }
    for (auto& note : secrets_notes(recipe, given)) out.notes.push_back(std::move(note));
  }
  return out;
}

}  // namespace trainer
