// The `trainer` command: train from a recipe, list plugins, print the resolved config.
// Exit codes: 0 ok, 2 usage/config error, 3 training failed, 4 no device, 130 interrupted.
#include <spdlog/spdlog.h>

#include <unistd.h>
#include <boost/program_options.hpp>

#include <csignal>
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench_suite.h"
#include "estimate.h"
#include "launch.h"
#include "mlflow_export.h"
#include "report.h"
#include "sweep.h"
#include "trainer/config_spec.h"
#include "trainer/devices.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/json.h"
#include "trainer/logging.h"
#include "trainer/memory.h"
#include "trainer/plugin_host.h"
#include "trainer/recipe.h"
#include "trainer/trainer.h"

namespace po = boost::program_options;

namespace {

const char* kUsage = R"(Usage:
  trainer --recipe FILE [OVERRIDE...]   train (see docs/recipes.md)
  trainer plugins [--recipe FILE] [--plugin-dir DIR]... [--markdown]
                                        list plugins found: version, events, config keys
                                        (--markdown: each plugin's config-key table, as in
                                        its README)
  trainer mem [--json]                  total / free / used memory per device, and this process's
  trainer estimate --recipe FILE [OVERRIDE...] [--find-max-batch] [--margin F] [--probe-sizes A,B,C] [--json]
                                        predict a training step's peak memory from a few probe
                                        steps: breakdown, whether it fits the budget or device,
                                        the largest micro-batch that does (docs/memory.md)
  trainer bench --recipe FILE --grid "k1=a,b k2=c,d" [OVERRIDE...] [--steps N] [--warmup W]
                [--csv FILE] [--md FILE] [--no-estimate] [--margin F]
                                        a benchmark suite over a grid of overrides: samples/s,
                                        step time, peak memory, out-of-memory errors per cell;
                                        cells predicted not to fit are marked, not run
  trainer launch --nproc N -- --recipe FILE [OVERRIDE...]
                                        a data-parallel run of N local processes (torchrun's
                                        variables, Gloo over 127.0.0.1); docs/distributed.md
  trainer sweep --recipe FILE [OVERRIDE...] [--study-dir DIR]
                                        a hyperparameter study over the recipe's [sweep] section:
                                        grid, random or TPE; trials predicted not to fit skipped,
                                        out-of-memory trials pruned; resumes from DIR/study.jsonl
  trainer report RUN_DIR [-o FILE]      one self-contained HTML page of the run: loss, accuracy,
                                        learning rate, throughput, memory with out-of-memory
                                        errors, the config (default FILE: RUN_DIR/report.html)
  trainer mlflow sync RUN_DIR [PREVIOUS_RUN_DIR...] [--tracking-uri URI]
                                        send what the run's MLflow journal holds that the server
                                        has not acknowledged (default: $MLFLOW_TRACKING_URI, else
                                        the server the run used); a run whose process died is
                                        marked FAILED; PREVIOUS_RUN_DIR: the run it resumed

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

/// "8,16,32" -> {8, 16, 32}; UsageError naming the option otherwise.
std::vector<std::int64_t> parse_sizes(const std::string& text, const std::string& option) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TRAINER_CHECK_T(trainer::UsageError, used == item.size() && !item.empty() && v >= 1, option, " '", text,
                    "': expected positive integers separated by commas, e.g. 8,16,32");
    out.push_back(v);
  }
  return out;
}

/// `trainer estimate`.
int estimate(const po::variables_map& vm, const std::vector<std::string>& overrides,
             const std::vector<std::string>& plugin_dirs) {
  trainer::tune::EstimateRequest req;
  req.recipe = vm["recipe"].as<std::string>();
  req.overrides = overrides;
  req.plugin_dirs = plugin_dirs;
  req.margin = vm["margin"].as<double>();
  if (vm.count("probe-sizes")) req.probe_sizes = parse_sizes(vm["probe-sizes"].as<std::string>(), "--probe-sizes");
  trainer::tune::MemoryEstimate e = trainer::tune::estimate_memory(req);
  if (vm.count("find-max-batch")) trainer::tune::find_max_batch(req, e);
  if (vm.count("json")) {
    trainer::tune::print_estimate_json(e, std::cout);
  } else {
    trainer::tune::print_estimate(e, std::cout);
  }
  return trainer::kExitOk;
}

/// `trainer bench`: 0 when every cell ran or was marked, 3 when a cell failed for another
/// reason than memory.
int bench(const po::variables_map& vm, const std::vector<std::string>& overrides,
          const std::vector<std::string>& plugin_dirs) {
  trainer::tune::BenchRequest req;
  req.recipe = vm["recipe"].as<std::string>();
  req.overrides = overrides;
  req.plugin_dirs = plugin_dirs;
  req.grid = trainer::tune::parse_grid(vm["grid"].as<std::string>());
  req.steps = vm["steps"].as<std::int64_t>();
  req.warmup = vm["warmup"].as<std::int64_t>();
  req.estimate = vm.count("no-estimate") == 0;
  req.margin = vm["margin"].as<double>();
  const auto open = [](const std::string& path) {
    auto f = std::make_unique<std::ofstream>(path);
    TRAINER_CHECK_T(trainer::UsageError, f->good(), "cannot write '", path, "'");
    return f;
  };
  // The files are opened first: a path that cannot be written fails before the suite runs.
  const auto csv = vm.count("csv") ? open(vm["csv"].as<std::string>()) : nullptr;
  const auto md = vm.count("md") ? open(vm["md"].as<std::string>()) : nullptr;
  const trainer::tune::BenchReport r = trainer::tune::run_bench(req, std::cerr);
  trainer::tune::print_bench_table(r, std::cout);
  if (csv) trainer::tune::write_bench_csv(r, *csv);
  if (md) trainer::tune::write_bench_markdown(r, *md);
  for (const auto& c : r.cells) {
    if (c.status == trainer::tune::CellStatus::Failed) return trainer::kExitTrainingFailed;
  }
  return trainer::kExitOk;
}

extern "C" void on_sweep_signal(int) { trainer::request_interrupt(); }

/// `trainer sweep`: 0 when a trial completed, 3 when none did, 130 when interrupted.
int sweep(const po::variables_map& vm, const std::vector<std::string>& overrides,
          const std::vector<std::string>& plugin_dirs) {
  trainer::tune::SweepRequest req;
  req.recipe = vm["recipe"].as<std::string>();
  req.overrides = overrides;
  req.plugin_dirs = plugin_dirs;
  if (vm.count("study-dir")) req.study_dir = vm["study-dir"].as<std::string>();
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  req.trainer_exe = n > 0 ? std::string(exe, static_cast<std::size_t>(n)) : std::string();
  const auto [settings, space] = trainer::tune::load_sweep(req.recipe, req.overrides);
  (void)space;
  std::signal(SIGINT, on_sweep_signal);
  std::signal(SIGTERM, on_sweep_signal);
  const trainer::tune::StudyResult r = trainer::tune::run_sweep(req, std::cerr);
  trainer::tune::print_study(r, settings.objective, std::cout);
  if (r.interrupted) return trainer::kExitInterrupted;
  return r.count(trainer::tune::TrialState::Complete) > 0 ? trainer::kExitOk : trainer::kExitTrainingFailed;
}

int run(int argc, char** argv) {
  // Everything after `launch` is the launcher's, then the ranks' (after --): not parsed here.
  if (argc > 1 && std::string(argv[1]) == "launch") {
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    TRAINER_CHECK(n > 0, "trainer launch: cannot find this executable (/proc/self/exe)");
    return trainer::cli::launch(std::string(self, static_cast<std::size_t>(n)), {argv + 2, argv + argc});
  }
  po::options_description opts("Options");
  opts.add_options()                                                                                             //
      ("help,h", "show this help")                                                                               //
      ("version", "print the trainer and LibTorch versions")                                                     //
      ("recipe,r", po::value<std::string>(), "recipe TOML file")                                                 //
      ("print-config", "print the resolved config (defaults filled) and exit")                                   //
      ("run-dir", po::value<std::string>(), "run directory (default <run.dir>/<run.name>-<time>)")               //
      ("resume", po::value<std::string>(), "resume from a checkpoint file or run directory")                     //
      ("log-level", po::value<std::string>()->default_value("info"), "trace, debug, info, warn, error, off")     //
      ("plugin-dir", po::value<std::vector<std::string>>(), "extra plugin directory (repeatable)")               //
      ("json", "trainer mem, estimate: JSON")                                                                    //
      ("tracking-uri", po::value<std::string>(), "trainer mlflow sync: the MLflow server to send to")            //
      ("output,o", po::value<std::string>(), "trainer report: the HTML file to write")                           //
      ("markdown", "trainer plugins: print each plugin's config-key table in Markdown")                          //
      ("find-max-batch", "trainer estimate: confirm the largest micro-batch with real steps")                    //
      ("margin", po::value<double>()->default_value(0.10), "trainer estimate: fraction of the limit kept free")  //
      ("probe-sizes", po::value<std::string>(), "trainer estimate: micro-batches probed, e.g. 8,16,32")          //
      ("grid", po::value<std::string>(), "trainer bench: \"key=v1,v2 key2=v3,v4\"")                              //
      ("steps", po::value<std::int64_t>()->default_value(10), "trainer bench: measured steps per cell")          //
      ("warmup", po::value<std::int64_t>()->default_value(2), "trainer bench: warm-up steps per cell")           //
      ("csv", po::value<std::string>(), "trainer bench: also write the results as CSV")                          //
      ("md", po::value<std::string>(), "trainer bench: also write the results as a Markdown table")              //
      ("no-estimate", "trainer bench: run every cell, also those predicted not to fit")                          //
      ("study-dir", po::value<std::string>(), "trainer sweep: the study directory (resumes when it has one)");
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
  if (!args.empty() && args.front() == "estimate") {
    if (!vm.count("recipe")) {
      std::cerr << "trainer estimate: --recipe is required\n";
      return trainer::kExitUsage;
    }
    return estimate(vm, {args.begin() + 1, args.end()}, plugin_dirs);
  }
  if (!args.empty() && args.front() == "bench") {
    if (!vm.count("recipe") || !vm.count("grid")) {
      std::cerr << "trainer bench: --recipe and --grid are required: trainer bench --recipe FILE --grid \"k=a,b\"\n";
      return trainer::kExitUsage;
    }
    return bench(vm, {args.begin() + 1, args.end()}, plugin_dirs);
  }
  if (!args.empty() && args.front() == "sweep") {
    if (!vm.count("recipe")) {
      std::cerr << "trainer sweep: --recipe is required\n";
      return trainer::kExitUsage;
    }
    return sweep(vm, {args.begin() + 1, args.end()}, plugin_dirs);
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
    if (args.size() < 3 || args[1] != "sync") {
      std::cerr << "trainer mlflow: usage: trainer mlflow sync RUN_DIR [PREVIOUS_RUN_DIR...] [--tracking-uri URI]\n";
      return trainer::kExitUsage;
    }
    return trainer::mlflow::sync_run_dir(args[2], vm.count("tracking-uri") ? vm["tracking-uri"].as<std::string>() : "",
                                         std::cout, std::cerr, {args.begin() + 3, args.end()});
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
    std::cerr << "trainer: run " << trainer::run_status_name(r.status) << " (exit " << r.exit_code << "): " << r.message
              << "\n"
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
