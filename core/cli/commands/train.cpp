// `trainer --recipe FILE [OVERRIDE...]`: train (or, with --print-config, print the resolved config).
// `trainer --resume RUN_DIR [OVERRIDE...]`: go on with a run, with the config it stored.
#include <filesystem>
#include <iostream>

#include "command.h"
#include "trainer/error.h"
#include "trainer/recipe.h"
#include "trainer/trainer.h"

namespace trainer::cli {

namespace {

/// `--resume PATH` without `--recipe`: the config.toml of the run directory PATH belongs to (the
/// run's resolved config, with every default filled in). A group override (`model=cnn`) would
/// be merged under it and change nothing: refused. prepare_run (RecipeKind::StoredConfig) then
/// refuses a plugin path or TorchScript file it names that the command line does not, and
/// notes the secrets it left out.
std::string stored_config(const Invocation& in) {
  const std::string resume = in.vm["resume"].as<std::string>();
  std::error_code ec;
  TRAINER_CHECK_T(UsageError, std::filesystem::exists(resume, ec), "--resume ", resume, ": not found");
  const std::string run_dir = run_dir_of_resume(resume);
  TRAINER_CHECK_T(UsageError, !run_dir.empty(), "--resume ", resume,
                  ": not a run directory or a checkpoint in a run's checkpoints/ directory, so no stored config "
                  "goes with it; give the recipe too: trainer --recipe FILE --resume ",
                  resume);
  const std::string config = (std::filesystem::path(run_dir) / "config.toml").string();
  TRAINER_CHECK_T(UsageError, std::filesystem::is_regular_file(config, ec), "--resume ", resume, ": ", config,
                  " not found (the run directory stores the config it ran with there); give the recipe: trainer "
                  "--recipe FILE --resume ",
                  resume);
  for (const auto& arg : in.args) {
    const Override o = parse_override(arg);
    // `model=cnn` names a group wherever configs/model/ is found; a stored config has no
    // top-level keys, so any `name=value` without a dot would be one.
    const bool group =
        o.kind == Override::Kind::Group || (o.kind == Override::Kind::Set && o.key.find('.') == std::string::npos);
    TRAINER_CHECK_T(UsageError, !group, "'", arg, "': --resume without --recipe uses ", config,
                    ", which holds every key already; a group cannot be swapped under it. Set its keys ", "instead (",
                    o.key, ".<key>=value), or give the recipe: trainer --recipe FILE --resume ", resume, " ", arg);
  }
  return config;
}

}  // namespace

Command train_command() {
  Command c;
  c.name = "";
  c.synopsis = "trainer --recipe FILE [OVERRIDE...] | trainer --resume RUN_DIR [OVERRIDE...]";
  c.summary = "train (see docs/recipes.md)";
  c.options = [](po::options_description& d) {
    d.add_options()                                                                                   //
        ("version", "print the trainer and LibTorch versions")                                        //
        ("recipe,r", po::value<std::string>(), "recipe TOML file")                                    //
        ("print-config", "print the resolved config (defaults filled) and exit")                      //
        ("run-dir", po::value<std::string>(), "run directory (default <run.dir>/<run.name>-<time>)")  //
        ("resume", po::value<std::string>(),
         "resume from a checkpoint file or run directory; without --recipe, with the config the run stored, in its "
         "directory")                                                                                           //
        ("log-level", po::value<std::string>()->default_value("info"), "trace, debug, info, warn, error, off")  //
        ("plugin-dir", po::value<std::vector<std::string>>(), "extra plugin directory (repeatable)");
  };
  c.run = [](const Invocation& in) -> int {
    if (in.vm.count("version")) {
      std::cout << "trainer " << TRAINER_VERSION << " (LibTorch " << TORCH_VERSION << ", plugin ABI "
                << TRAINER_ABI_VERSION << ")\n";
      return kExitOk;
    }
    TRAINER_CHECK_T(UsageError, in.vm.count("recipe") || in.vm.count("resume"),
                    "--recipe (or --resume RUN_DIR) is required (trainer --help lists the commands)");
    const PreparedRun prepared =
        in.vm.count("recipe") ? prepare_run(in.vm["recipe"].as<std::string>(), in.args, in.plugin_dirs)
                              : prepare_run(stored_config(in), in.args, in.plugin_dirs, RecipeKind::StoredConfig);
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
                << "\n";
      if (!r.run_dir.empty()) std::cerr << "trainer: run directory " << r.run_dir << "\n";
    }
    return r.exit_code;
  };
  return c;
}

}  // namespace trainer::cli
