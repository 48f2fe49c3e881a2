#pragma once
/// The one mapping from an exception to how it ends the `trainer` process: the exit code, the
/// run status it means and the kind of failure. Trainer::fit() maps a run's failure with it, the
/// `trainer` command an error before or outside a run.
#include <exception>

#include "trainer/error.h"
#include "trainer/export.h"
#include "trainer/states.h"

namespace trainer {

struct ExitStatus {
  int exit_code = kExitTrainingFailed;
  RunStatus status = RunStatus::Failed;
  FailureKind failure = FailureKind::Error;
};

/// ExitRequest: its code and status; a usage or config error: 2; an out-of-memory error that
/// was not recovered from: 3, out_of_memory; a diverged run (training.on_nonfinite = "stop", or
/// "skip_step" past training.max_skipped_steps in a row): 3, diverged; anything else: 3. A
/// PluginError is a usage error (2) before a run (`during_run` false: a plugin the recipe lists
/// cannot be loaded) and a failed run (3) during one (an essential plugin threw).
TRAINER_API ExitStatus exit_status_of(const std::exception& e, bool during_run);

}  // namespace trainer
