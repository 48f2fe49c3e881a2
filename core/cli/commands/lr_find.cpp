// `trainer lr-find`: a learning rate suggested by a short exponential sweep (Lightning's finder).
#include <iostream>

#include "command.h"
#include "lr_find.h"
#include "trainer/error.h"

namespace trainer::cli {

Command lr_find_command() {
  Command c;
  c.name = "lr-find";
  c.synopsis =
      "trainer lr-find --recipe FILE [OVERRIDE...] [--min-lr A] [--max-lr B] [--steps N] [--diverge-factor F] "
      "[--run-dir DIR] [--json]";
  c.summary =
      "suggest a learning rate: a short run whose learning rate\n"
      "rises exponentially, stopped when the loss diverges; the\n"
      "curve in trainer report (docs/recipes.md)";
  c.options = [](po::options_description& d) {
    d.add_options()                                                                                      //
        ("recipe,r", po::value<std::string>(), "recipe TOML file")                                       //
        ("plugin-dir", po::value<std::vector<std::string>>(), "extra plugin directory (repeatable)")     //
        ("min-lr", po::value<double>()->default_value(1e-7, "1e-07"), "the first step's learning rate")  //
        ("max-lr", po::value<double>()->default_value(1.0, "1"), "the last step's learning rate")        //
        ("steps", po::value<std::int64_t>()->default_value(100), "optimizer steps of the sweep")         //
        ("diverge-factor", po::value<double>()->default_value(4.0, "4"),
         "stop once the smoothed loss passes this times its best; 0 = never")                                   //
        ("run-dir", po::value<std::string>(), "run directory (default <run.dir>/<run.name>-lr-find-<time>)")    //
        ("log-level", po::value<std::string>()->default_value("info"), "trace, debug, info, warn, error, off")  //
        ("json", "print JSON");
  };
  // 0 with or without a suggestion; the run's own exit code when it failed or was interrupted.
  c.run = [](const Invocation& in) -> int {
    TRAINER_CHECK_T(UsageError, in.vm.count("recipe"), "--recipe is required");
    tune::LrFindRequest req;
    req.recipe = in.vm["recipe"].as<std::string>();
    req.overrides = in.args;
    req.plugin_dirs = in.plugin_dirs;
    req.min_lr = in.vm["min-lr"].as<double>();
    req.max_lr = in.vm["max-lr"].as<double>();
    req.steps = in.vm["steps"].as<std::int64_t>();
    req.diverge_factor = in.vm["diverge-factor"].as<double>();
    req.log_level = in.vm["log-level"].as<std::string>();
    if (in.vm.count("run-dir")) req.run_dir = in.vm["run-dir"].as<std::string>();
    const tune::LrFindResult r = tune::find_lr(req);
    if (r.exit_code != kExitOk) {
      std::cerr << "trainer lr-find: run " << run_status_name(r.status) << " (exit " << r.exit_code
                << "): " << r.message << "\n";
      if (!r.run_dir.empty()) std::cerr << "trainer lr-find: run directory " << r.run_dir << "\n";
      return r.exit_code;
    }
    if (in.vm.count("json")) {
      std::cout << tune::lr_find_json(r) << "\n";
    } else {
      tune::print_lr_find(r, std::cout);
    }
    return kExitOk;
  };
  return c;
}

}  // namespace trainer::cli
