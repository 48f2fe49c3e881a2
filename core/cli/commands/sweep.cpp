// `trainer sweep`: a hyperparameter study over the recipe's [sweep] section.
#include <csignal>
#include <iostream>

#include "command.h"
#include "sweep.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"

namespace trainer::cli {

namespace {
extern "C" void on_sweep_signal(int) { request_interrupt(); }
}  // namespace

Command sweep_command() {
  Command c;
  c.name = "sweep";
  c.synopsis = "trainer sweep --recipe FILE [OVERRIDE...] [--study-dir DIR]";
  c.summary =
      "a hyperparameter study over the recipe's [sweep] section:\n"
      "grid, random or TPE; trials predicted not to fit skipped,\n"
      "out-of-memory trials pruned; resumes from DIR/study.jsonl";
  c.options = [](po::options_description& d) {
    d.add_options()                                                                                   //
        ("recipe,r", po::value<std::string>(), "recipe TOML file")                                    //
        ("plugin-dir", po::value<std::vector<std::string>>(), "extra plugin directory (repeatable)")  //
        ("study-dir", po::value<std::string>(), "the study directory (resumes when it has one)");
  };
  // 0 when a trial completed, 3 when none did, 130 when interrupted.
  c.run = [](const Invocation& in) -> int {
    TRAINER_CHECK_T(UsageError, in.vm.count("recipe"), "--recipe is required");
    tune::SweepRequest req;
    req.recipe = in.vm["recipe"].as<std::string>();
    req.overrides = in.args;
    req.plugin_dirs = in.plugin_dirs;
    if (in.vm.count("study-dir")) req.study_dir = in.vm["study-dir"].as<std::string>();
    req.trainer_exe = in.self;
    const auto [settings, space] = tune::load_sweep(req.recipe, req.overrides);
    (void)space;
    std::signal(SIGINT, on_sweep_signal);
    std::signal(SIGTERM, on_sweep_signal);
    const tune::StudyResult r = tune::run_sweep(req, std::cerr);
    tune::print_study(r, settings.objective, std::cout);
    if (r.interrupted) return static_cast<int>(kExitInterrupted);
    return static_cast<int>(r.count(tune::TrialState::Complete) > 0 ? kExitOk : kExitTrainingFailed);
  };
  return c;
}

}  // namespace trainer::cli
