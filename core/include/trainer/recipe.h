#pragma once
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/config_spec.h"
#include "trainer/core_settings.h"  // core_config_sections
#include "trainer/export.h"
#include "trainer/settings.h"

namespace trainer {

class Plugin;

/// One command-line override (docs/recipes.md, "Overrides").
struct Override {
  enum class Kind {
    Set,     ///< `a.b=value`: change a key the recipe, its groups or the schema defines
    Add,     ///< `+a.b=value`: add a key the recipe does not define (still checked against the schema)
    Group,   ///< `model=cnn`: use configs/model/cnn.toml for the `model` group
    Preset,  ///< `smoke`: merge configs/smoke.toml after the recipe (it wins over the recipe)
  };
  Kind kind = Kind::Set;
  std::string key;    ///< dotted key, group name or preset name
  std::string value;  ///< the text after '=' (Set/Add/Group)
  std::string text;   ///< the override as typed, for messages (a secret's value and a URI's credentials left out)
};

/// Parses `a.b=1`, `+a.b="x"`, `model=cnn`, `robust`. Throws ConfigError on bad syntax.
TRAINER_API Override parse_override(const std::string& text);

/// Turns override text into a typed value: TOML syntax first (`3`, `0.5`, `true`, `[1, 2]`,
/// `"s"`), else the raw text as a string.
TRAINER_API ConfigValue parse_override_value(const std::string& text);

/// A recipe merged with its groups and the command-line overrides, before validation.
struct TRAINER_API LoadedRecipe {
  Config config;  ///< merged: groups in order, the recipe, presets, then overrides
  std::vector<Override> overrides;
  std::set<std::string> file_keys;   ///< leaf keys defined by the recipe and its groups
  std::vector<std::string> sources;  ///< files merged, in order
  std::string path;                  ///< the recipe file itself (errors without a key's origin name it)
  /// The plugin libraries found on the search path (prepare_run sets it): a `plugins.<name>`
  /// section of a plugin not loaded is inert when <name> is one of them, an error (a typo)
  /// when not. Unset: every such section is inert.
  std::optional<std::vector<std::string>> plugin_libraries;
  /// Filled by validate_recipe: `plugins.<name>` sections of plugins not loaded (kept, not checked).
  std::vector<std::string> inert_sections;
};

/// Loads `recipe_path`: its `defaults = [...]` groups (with `group=option` overrides applied),
/// the recipe itself, presets named on the command line, then `key=value` overrides. Groups
/// are searched in `config_dirs`, the recipe's `../configs` and `configs/`,
/// `$TRAINER_CONFIG_PATH` and the installed configs. Collects every problem it can and
/// throws one ConfigError.
TRAINER_API LoadedRecipe load_recipe(const std::string& recipe_path, const std::vector<std::string>& overrides,
                                     const std::vector<std::string>& config_dirs = {});

/// Validates a loaded recipe against the core schema plus `extra` (plugin sections), checks
/// the override rules (`a.b=v` must name a known key, `+a.b=v` a new one), fills defaults.
/// Throws ConfigError listing every problem.
TRAINER_API void validate_recipe(LoadedRecipe& recipe, const std::vector<SectionSpec>& extra = {});

/// A recipe resolved and validated, with its plugins loaded and ready for a Trainer.
struct PreparedRun {
  Config config;
  std::vector<std::shared_ptr<Plugin>> plugins;
  std::vector<std::string> sources;  ///< config files merged, in order
  /// What the user should know but is not an error: "[plugins.console] is inert: plugin
  /// 'console' is not in plugins.load". `--print-config` prints them as comments; a run logs them.
  std::vector<std::string> notes;
};

/// What prepare_run's `recipe` file is.
enum class RecipeKind {
  Recipe,  ///< a recipe the user gave (`--recipe FILE`): its groups, paths and code are the user's
  /// The config.toml a run directory stored (`--resume RUN_DIR` without `--recipe`): data, which
  /// whoever could write the directory may have changed. It is already resolved, so it names no
  /// groups (`defaults` is refused) and groups (presets on the command line) are not searched
  /// beside it; the code it and its presets name is refused unless the command line gives it
  /// (refuse_stored_code_paths); the keys it left out as secrets (run_config_toml) become notes.
  StoredConfig,
};

/// Loads `recipe` with `overrides`, loads the plugins it names (searching `plugin_dirs`,
/// then the recipe's plugins.path, $TRAINER_PLUGIN_PATH and the default directories) and
/// validates everything. A RecipeKind::StoredConfig is checked first, and its resolved config
/// again before any plugin is loaded: a path to load code from, in the stored file or in a
/// preset the command line names, is refused naming the file and line it came from; and each
/// key it left out as a secret that neither an override nor a preset gives again is a note
/// (the run goes on without it; how to give it again: `key=VALUE`), which a run logs as a
/// warning. Throws ConfigError or PluginError (exit code 2).
TRAINER_API PreparedRun prepare_run(const std::string& recipe, const std::vector<std::string>& overrides,
                                    const std::vector<std::string>& plugin_dirs = {},
                                    RecipeKind kind = RecipeKind::Recipe);

/// For `--resume RUN_DIR` without `--recipe`, which runs with the config the run directory
/// stored (`stored_config`): that file is data, which whoever could write the directory may have
/// changed, and loading a plugin library or a TorchScript file runs its code (a library's
/// constructors run before any check; a TorchScript module's code when it is loaded). So a
/// stored config may name plugins (`plugins.load = ["lora"]`, searched where the command line,
/// $TRAINER_PLUGIN_PATH and the default directories say), but a path in `plugins.load` or
/// `plugins.path` is refused unless the user's command line gives the same path too: in an
/// override that replaces the key (`'plugins.load=["/x/libtrainer_plugin_y.so"]'`,
/// `'plugins.path=["/x"]'`) or, for a directory, `--plugin-dir` (`plugin_dirs`). Likewise the
/// TorchScript files of `model.path` (model "torchscript") and `task.loss_path` are refused
/// unless an override gives the key. A `defaults = [...]` in it is refused too: trainer writes
/// config.toml resolved, with no groups, and a group file would be found beside the stored
/// file, in the directory that is data (groups go with `--recipe`). Throws ConfigError (exit 2)
/// naming the file and line, the key and each path, and how to give it. prepare_run with
/// RecipeKind::StoredConfig calls it, and checks the resolved config the same way.
TRAINER_API void refuse_stored_code_paths(const std::string& stored_config, const std::vector<std::string>& overrides,
                                          const std::vector<std::string>& plugin_dirs);

/// The keys every `plugins.<name>` section has besides the plugin's own. Unset: the plugin's
/// default_priority() and default_policy().
struct PluginDispatch : Settings<PluginDispatch> {
  std::optional<std::int64_t> priority;
  std::optional<std::string> policy;

  static void declare(SettingsSchema<PluginDispatch>& s) {
    s.add(&PluginDispatch::priority, "priority", "Dispatch order: lower runs first")
        .min(-1000000)
        .max(1000000);  // an int, with room for arithmetic on it
    s.add(&PluginDispatch::policy, "policy",
          "When a handler throws: observer logs and continues, essential fails the run")
        .choices({"observer", "essential"});
  }
};

/// The config sections of `plugins`: `plugins.<name>` with each plugin's keys plus
/// PluginDispatch's.
TRAINER_API std::vector<SectionSpec> plugin_config_sections(const std::vector<std::shared_ptr<Plugin>>& plugins);

}  // namespace trainer
