// `trainer --recipe FILE [OVERRIDE...]`: train (or, with --print-config, print the resolved config).
#include <iostream>

#include "command.h"
#include "trainer/error.h"
#include "trainer/recipe.h"
#include "trainer/trainer.h"

namespace trainer::cli {

Command train_command() {
  Command c;
  c.name = "";
  c.synopsis = "trainer --recipe FILE [OVERRIDE...]";
  c.summary = "train (see docs/recipes.md)";
  c.options = [](po::options_description& d) {
    d.add_options()                                                                                             //
        ("version", "print the trainer and LibTorch versions")                                                  //
        ("recipe,r", po::value<std::string>(), "recipe TOML file")                                              //
        ("print-config", "print the resolved config (defaults filled) and exit")                                //
        ("run-dir", po::value<std::string>(), "run directory (default <run.dir>/<run.name>-<time>)")            //
        ("resume", po::value<std::string>(), "resume from a checkpoint file or run directory")                  //
        ("log-level", po::value<std::string>()->default_value("info"), "trace, debug, info, warn, error, off")  //
        ("plugin-dir", po::value<std::vector<std::string>>(), "extra plugin directory (repeatable)");
  };
  c.run = [](const Invocation& in) -> int {
    if (in.vm.count("version")) {
      std::cout << "trainer " << TRAINER_VERSION << " (LibTorch " << TORCH_VERSION << ", plugin ABI "
                << TRAINER_ABI_VERSION << ")\n";
      return kExitOk;
    }
    TRAINER_CHECK_T(UsageError, in.vm.count("recipe"), "--recipe is required (trainer --help lists the commands)");
    const PreparedRun prepared = prepare_run(in.vm["recipe"].as<std::string>(), in.args, in.plugin_dirs);
    if (in.vm.count("print-config")) {
      std::cout << "# resolved from: ";
      for (std::size_t i = 0; i < prepared.sources.size(); ++i) std::cout << (i ? ", " : "") << prepared.sources[i];
      std::cout << "\n";
      for (const auto& note : prepared.notes) std::cout << "# " << note << "\n";
      std::cout << prepared.config.to_toml();
      return kExitOk;
    }
    TrainerOptions options;
    options.config = prepared.config;
    options.plugins = prepared.plugins;
    options.notes = prepared.notes;
    options.handle_signals = true;
    options.log_level = in.vm["log-level"].as<std::string>();
    if (in.vm.count("run-dir")) options.run_dir = in.vm["run-dir"].as<std::string>();
    if (in.vm.count("resume")) options.resume = in.vm["resume"].as<std::string>();
    Trainer t(std::move(options));
    const RunResult r = t.fit();
    if (r.exit_code != kExitOk) {
      std::cerr << "trainer: run " << run_status_name(r.status) << " (exit " << r.exit_code << "): " << r.message
                << "\n"
                << "trainer: run directory " << r.run_dir << "\n";
    }
    return r.exit_code;
  };
  return c;
}

}  // namespace trainer::cli
