// The `trainer` command: train from a recipe, list plugins, print the resolved config.
// Exit codes: 0 ok, 2 usage/config error, 3 training failed, 4 no device, 130 interrupted.
#include <spdlog/spdlog.h>

#include <boost/program_options.hpp>
#include <iostream>

#include "trainer/devices.h"
#include "trainer/config_spec.h"
#include "trainer/error.h"
#include "trainer/json.h"
#include "trainer/logging.h"
#include "trainer/memory.h"
#include "trainer/plugin_host.h"
#include "trainer/recipe.h"
#include "trainer/trainer.h"
#include "mlflow_export.h"
#include "report.h"

namespace po = boost::program_options;

namespace {

const char* kUsage = R"(Usage:
  trainer --recipe FILE [OVERRIDE...]   train (see docs/recipes.md)
  trainer plugins [--recipe FILE] [--plugin-dir DIR]... [--markdown]
                                        list plugins found: version, events, config keys
                                        (--markdown: each plugin's config-key table, as in
                                        its README)
  trainer mem [--json]                  total / free / used memory per device, and this process's
  trainer report RUN_DIR [-o FILE]      one self-contained HTML page of the run: loss, accuracy,
                                        learning rate, throughput, memory with out-of-memory
                                        errors, the config (default FILE: RUN_DIR/report.html)
  trainer mlflow sync RUN_DIR [--tracking-uri URI]
                                        send what the run's MLflow journal holds that the server
                                        has not acknowledged (default: the server the run used);
                                        a run whose process died is marked FAILED

Overrides:
  a.b=value       change a key (value in TOML syntax; bare words are strings)
  +a.b=value      add a key the recipe does not have
  group=option    pick configs/<group>/<option>.toml (e.g. model=mlp)
  preset          merge configs/<preset>.toml after the recipe (e.g. smoke)

Exit codes: 0 ok, 2 usage or config error, 3 training failed, 4 no device could be had
(device_select), 130 interrupted.
)";

std::string join_events(const std::vector<trainer::Event>& events) {
  std::vector<std::string> names;
  for (auto e : events) names.emplace_back(trainer::event_name(e));
  return trainer::detail::join(names);
}

int list_plugins(const std::vector<std::string>& dirs, bool markdown) {
  trainer::PluginHost host(dirs);
  std::vector<std::string> errors;
  const auto infos = host.discover(&errors);
  if (markdown) {
    for (const auto& p : infos) {
      std::cout << "## " << p.name << "\n\n" << trainer::key_table_markdown(p.keys, "plugins." + p.name + ".") << "\n";
    }
    for (const auto& e : errors) std::cerr << "error: " << e << "\n";
    return errors.empty() ? trainer::kExitOk : trainer::kExitUsage;
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
      if (k.default_value) std::cout << ", default " << trainer::config_value_to_toml(*k.default_value);
      std::cout << "): " << k.doc << "\n";
    }
    std::cout << "    priority (integer): dispatch order, lower first\n";
    std::cout << "    policy (string, one of: observer, essential): what a throwing handler does\n\n";
  }
  for (const auto& e : errors) std::cout << "error: " << e << "\n";
  return errors.empty() ? trainer::kExitOk : trainer::kExitUsage;
}

/// `trainer mem`: every GPU the device inventory sees (NVML: per process too) and the host's
/// memory with this process's.
int show_memory(bool json) {
  const trainer::HostMemory h = trainer::host_memory();
  const trainer::InventorySnapshot inv = trainer::device_inventory()->snapshot();
  if (json) {
    using trainer::json_quote;
    std::cout << "{\"source\":" << json_quote(inv.source) << ",\"notes\":[";
    for (std::size_t i = 0; i < inv.notes.size(); ++i) std::cout << (i ? "," : "") << json_quote(inv.notes[i]);
    std::cout << "],\"devices\":[";
    for (const auto& g : inv.gpus) {
      std::cout << "{\"device\":" << json_quote(g.id) << ",\"name\":" << json_quote(g.name)
                << ",\"uuid\":" << json_quote(g.uuid) << ",\"pci_bus_id\":" << json_quote(g.pci_bus_id)
                << ",\"physical_index\":" << g.physical_index << ",\"total_bytes\":" << g.total
                << ",\"free_bytes\":" << g.free << ",\"used_bytes\":" << g.used
                << ",\"utilization_percent\":" << g.utilization << ",\"error\":" << json_quote(g.error)
                << ",\"processes\":[";
      for (std::size_t i = 0; i < g.processes.size(); ++i) {
        std::cout << (i ? "," : "") << "{\"pid\":" << g.processes[i].pid
                  << ",\"used_bytes\":" << g.processes[i].used_bytes << "}";
      }
      std::cout << "]},";
    }
    std::cout << "{\"device\":\"cpu\",\"total_bytes\":" << h.total << ",\"free_bytes\":" << h.available
              << ",\"used_bytes\":" << (h.total - h.available) << ",\"process_rss_bytes\":" << h.process_rss
              << ",\"process_peak_rss_bytes\":" << h.process_peak_rss << "}]}\n";
    return trainer::kExitOk;
  }
  auto col = [](std::int64_t b) {
    std::string s = b < 0 ? "unknown" : trainer::format_bytes(b);
    return s + std::string(s.size() < 12 ? 12 - s.size() : 1, ' ');
  };
  std::cout << "device  total       free        used        details\n";
  for (const auto& g : inv.gpus) {
    std::string id = g.id;
    id.resize(std::max<std::size_t>(id.size() + 1, 8), ' ');
    std::cout << id << col(g.total) << col(g.free) << col(g.used) << g.name;
    if (g.utilization >= 0) std::cout << ", utilisation " << g.utilization << " %";
    if (!g.error.empty()) std::cout << ", error: " << g.error;
    std::cout << "\n";
    for (const auto& p : g.processes) {
      std::cout << "          pid " << p.pid << ": "
                << (p.used_bytes < 0 ? "unknown" : trainer::format_bytes(p.used_bytes)) << "\n";
    }
  }
  std::cout << "cpu     " << col(h.total) << col(h.available) << col(h.total - h.available)
            << "this process: " << trainer::format_bytes(h.process_rss) << " rss, "
            << trainer::format_bytes(h.process_peak_rss) << " peak\n";
  std::cout << "GPUs via " << inv.source;
  for (const auto& n : inv.notes) std::cout << "; " << n;
  std::cout << "\n";
  return trainer::kExitOk;
}

int run(int argc, char** argv) {
  po::options_description opts("Options");
  opts.add_options()                                                                                          //
      ("help,h", "show this help")                                                                            //
      ("version", "print the trainer and LibTorch versions")                                                  //
      ("recipe,r", po::value<std::string>(), "recipe TOML file")                                              //
      ("print-config", "print the resolved config (defaults filled) and exit")                                //
      ("run-dir", po::value<std::string>(), "run directory (default <run.dir>/<run.name>-<time>)")            //
      ("resume", po::value<std::string>(), "resume from a checkpoint file or run directory")                  //
      ("log-level", po::value<std::string>()->default_value("info"), "trace, debug, info, warn, error, off")  //
      ("plugin-dir", po::value<std::vector<std::string>>(), "extra plugin directory (repeatable)")            //
      ("json", "trainer mem: print JSON")                                                                    //
      ("tracking-uri", po::value<std::string>(), "trainer mlflow sync: the MLflow server to send to")        //
      ("output,o", po::value<std::string>(), "trainer report: the HTML file to write")                       //
      ("markdown", "trainer plugins: print each plugin's config-key table in Markdown");
  po::options_description hidden;
  hidden.add_options()("args", po::value<std::vector<std::string>>(), "");
  po::options_description all;
  all.add(opts).add(hidden);
  po::positional_options_description pos;
  pos.add("args", -1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "trainer: " << e.what() << "\n\n" << kUsage << opts;
    return trainer::kExitUsage;
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << opts;
    return trainer::kExitOk;
  }
  if (vm.count("version")) {
    std::cout << "trainer " << TRAINER_VERSION << " (LibTorch " << TORCH_VERSION << ", plugin ABI "
              << TRAINER_ABI_VERSION << ")\n";
    return trainer::kExitOk;
  }
  std::vector<std::string> args =
      vm.count("args") ? vm["args"].as<std::vector<std::string>>() : std::vector<std::string>{};
  std::vector<std::string> plugin_dirs =
      vm.count("plugin-dir") ? vm["plugin-dir"].as<std::vector<std::string>>() : std::vector<std::string>{};

  if (!args.empty() && args.front() == "mem") {
    if (args.size() > 1) {
      std::cerr << "trainer mem: unexpected argument '" << args[1] << "'\n";
      return trainer::kExitUsage;
    }
    return show_memory(vm.count("json") != 0);
  }
  if (!args.empty() && args.front() == "report") {
    if (args.size() != 2) {
      std::cerr << "trainer report: usage: trainer report RUN_DIR [-o FILE]\n";
      return trainer::kExitUsage;
    }
    std::string written;
    const int rc = trainer::report::write_report(args[1], vm.count("output") ? vm["output"].as<std::string>() : "",
                                                 std::cerr, &written);
    if (rc == 0) std::cout << "trainer report: wrote " << written << "\n";
    return rc;
  }
  if (!args.empty() && args.front() == "mlflow") {
    if (args.size() != 3 || args[1] != "sync") {
      std::cerr << "trainer mlflow: usage: trainer mlflow sync RUN_DIR [--tracking-uri URI]\n";
      return trainer::kExitUsage;
    }
    return trainer::mlflow::sync_run_dir(args[2], vm.count("tracking-uri") ? vm["tracking-uri"].as<std::string>() : "",
                                         std::cout, std::cerr);
  }
  if (!args.empty() && args.front() == "plugins") {
    if (args.size() > 1) {
      std::cerr << "trainer plugins: unexpected argument '" << args[1] << "'\n";
      return trainer::kExitUsage;
    }
    if (vm.count("recipe")) {
      const auto loaded = trainer::load_recipe(vm["recipe"].as<std::string>(), {});
      for (auto& d : loaded.config.get_or<std::vector<std::string>>("plugins.path", {})) plugin_dirs.push_back(d);
    }
    return list_plugins(plugin_dirs, vm.count("markdown") != 0);
  }
  if (!vm.count("recipe")) {
    std::cerr << "trainer: --recipe is required\n\n" << kUsage;
    return trainer::kExitUsage;
  }
  const std::string recipe = vm["recipe"].as<std::string>();
  trainer::PreparedRun prepared = trainer::prepare_run(recipe, args, plugin_dirs);
  if (vm.count("print-config")) {
    std::cout << "# resolved from: ";
    for (std::size_t i = 0; i < prepared.sources.size(); ++i) std::cout << (i ? ", " : "") << prepared.sources[i];
    std::cout << "\n";
    for (const auto& note : prepared.notes) std::cout << "# " << note << "\n";
    std::cout << prepared.config.to_toml();
    return trainer::kExitOk;
  }
  trainer::TrainerOptions options;
  options.config = prepared.config;
  options.plugins = prepared.plugins;
  options.notes = prepared.notes;
  options.handle_signals = true;
  options.log_level = vm["log-level"].as<std::string>();
  if (vm.count("run-dir")) options.run_dir = vm["run-dir"].as<std::string>();
  if (vm.count("resume")) options.resume = vm["resume"].as<std::string>();
  trainer::Trainer t(std::move(options));
  const trainer::RunResult r = t.fit();
  if (r.exit_code != trainer::kExitOk) {
    std::cerr << "trainer: run " << r.status << " (exit " << r.exit_code << "): " << r.message << "\n"
              << "trainer: run directory " << r.run_dir << "\n";
  }
  return r.exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything can start CUDA: number GPUs in PCI-bus order, as NVML does.
  const std::string order_warning = trainer::prefer_pci_bus_order();
  if (!order_warning.empty()) std::cerr << "trainer: warning: " << order_warning << "\n";
  try {
    return run(argc, argv);
  } catch (const trainer::ConfigError& e) {
    std::cerr << "trainer: " << e.problems().size() << " config error" << (e.problems().size() == 1 ? "" : "s")
              << ":\n";
    for (const auto& p : e.problems()) std::cerr << "  " << p << "\n";
    return trainer::kExitUsage;
  } catch (const trainer::UsageError& e) {
    std::cerr << "trainer: " << e.what() << "\n";
    return trainer::kExitUsage;
  } catch (const trainer::PluginError& e) {
    std::cerr << "trainer: " << e.what() << "\n";
    return trainer::kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "trainer: " << e.what() << "\n";
    return trainer::kExitTrainingFailed;
  }
}
