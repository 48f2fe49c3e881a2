// `trainer plugins`: the plugins found, their events and config keys, and the models,
// datasets, optimizers, schedules and tasks each registers with their keys.
#include <fmt/ranges.h>
#include <iostream>

#include "command.h"
#include "trainer/config_spec.h"
#include "trainer/error.h"
#include "trainer/plugin_host.h"
#include "trainer/recipe.h"

namespace trainer::cli {

namespace {

std::string join_events(const std::vector<Event>& events) {
  std::vector<std::string> names;
  for (auto e : events) names.emplace_back(event_name(e));
  return fmt::to_string(fmt::join(names, ", "));
}

/// The config section of a registry's entries.
std::string section_of(const std::string& kind) {
  if (kind == "optimizer") return "optim";
  if (kind == "schedule") return "sched";
  return kind;
}

int list_plugins(const std::vector<std::string>& dirs, bool markdown) {
  PluginHost host(dirs);
  std::vector<std::string> errors;
  const auto infos = host.discover(&errors);
  if (markdown) {
    for (const auto& p : infos) {
      std::cout << "## " << p.name << "\n\n" << key_table_markdown(p.keys, "plugins." + p.name + ".") << "\n";
      for (const auto& r : p.registers) {
        std::cout << "### " << r.kind << " `" << r.name << "`\n\n"
                  << key_table_markdown(r.keys, section_of(r.kind) + ".") << "\n";
      }
    }
    for (const auto& e : errors) std::cerr << "error: " << e << "\n";
    return errors.empty() ? kExitOk : kExitUsage;
  }
  std::cout << "Plugin search path:\n";
  for (const auto& d : host.search_path()) std::cout << "  " << d << "\n";
  std::cout << "\n";
  if (infos.empty()) std::cout << "No plugins found.\n";
  for (const auto& p : infos) {
    std::cout << p.name << " " << p.version << "  (" << p.path << ")\n";
    if (!p.description.empty()) std::cout << "  " << p.description << "\n";
    std::cout << "  events: " << join_events(p.events) << "\n";
    std::cout << "  config keys ([plugins." << p.name << "]):\n";
    for (const auto& k : p.keys) {
      std::cout << "    " << k.key << " (" << k.describe();
      if (k.default_value) std::cout << ", default " << config_value_to_toml(*k.default_value);
      std::cout << "): " << k.doc << "\n";
    }
    std::cout << "    priority (integer): dispatch order, lower first\n";
    std::cout << "    policy (string, one of: observer, essential): what a throwing handler does\n";
    for (const auto& r : p.registers) {
      std::cout << "  registers " << r.kind << " '" << r.name << "'" << (r.doc.empty() ? "" : ": " + r.doc)
                << "\n    config keys ([" << section_of(r.kind) << "] with name = \"" << r.name << "\"):\n";
      for (const auto& k : r.keys) {
        std::cout << "    " << k.key << " (" << k.describe();
        if (k.default_value) std::cout << ", default " << config_value_to_toml(*k.default_value);
        std::cout << "): " << k.doc << "\n";
      }
    }
    std::cout << "\n";
  }
  for (const auto& e : errors) std::cout << "error: " << e << "\n";
  return errors.empty() ? kExitOk : kExitUsage;
}

}  // namespace

Command plugins_command() {
  Command c;
  c.name = "plugins";
  c.synopsis = "trainer plugins [--recipe FILE] [--plugin-dir DIR]... [--markdown]";
  c.summary =
      "list plugins found: version, events, config keys\n"
      "(--markdown: each plugin's config-key table, as in its README)";
  c.options = [](po::options_description& d) {
    d.add_options()                                                                                   //
        ("recipe,r", po::value<std::string>(), "also search the recipe's plugins.path")               //
        ("plugin-dir", po::value<std::vector<std::string>>(), "extra plugin directory (repeatable)")  //
        ("markdown", "print each plugin's config-key table in Markdown");
  };
  c.run = [](const Invocation& in) -> int {
    TRAINER_CHECK_T(UsageError, in.args.empty(), "unexpected argument '", in.args.empty() ? "" : in.args.front(), "'");
    std::vector<std::string> dirs = in.plugin_dirs;
    if (in.vm.count("recipe")) {
      const auto loaded = load_recipe(in.vm["recipe"].as<std::string>(), {});
      for (auto& d : loaded.config.get_or<std::vector<std::string>>("plugins.path", {})) dirs.push_back(d);
    }
    return list_plugins(dirs, in.vm.count("markdown") != 0);
  };
  return c;
}

}  // namespace trainer::cli
