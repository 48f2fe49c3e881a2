#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/error.h"
#include "trainer/export.h"
#include "trainer/interrupt.h"
#include "trainer/model.h"
#include "trainer/plugin.h"
#include "trainer/recipe.h"  // prepare_run: what a program that trains needs first

namespace trainer {

/// Everything a run needs besides its config.
struct TrainerOptions {
  /// Validated config with defaults filled (validate_recipe).
  Config config;
  /// Run directory; empty: the run directory `resume` belongs to (run_dir_of_resume: the run
  /// continues in place), else `<run.dir>/<run.name>-<YYYYmmdd-HHMMSS>`. With
  /// checkpoint.autoresume, a run directory given here that holds a checkpoint is resumed.
  std::string run_dir;
  /// Checkpoint file or run directory to resume from; empty: start fresh.
  std::string resume;
  /// Plugins in load order (PluginHost::load, or in-process objects in tests).
  std::vector<std::shared_ptr<Plugin>> plugins;
  /// Install SIGINT/SIGTERM handlers: stop at the next safe point, checkpoint, exit 130.
  bool handle_signals = false;
  /// spdlog level name.
  std::string log_level = "info";
  /// Logged as warnings when the run starts (PreparedRun::notes).
  std::vector<std::string> notes;
};

/// The run directory a resume path belongs to: a directory that has `checkpoints/`, the
/// parent of a `checkpoints/` directory, or for a checkpoint file in a `checkpoints/`
/// directory its parent; empty for anything else (a folder of checkpoint files, a file
/// elsewhere, a path that does not exist). Nothing is read but the directories' entries.
TRAINER_API std::string run_dir_of_resume(const std::string& resume);

/// How a run ended.
struct RunResult {
  int exit_code = kExitOk;  ///< kExitOk, kExitUsage, kExitTrainingFailed, kExitNoDevice, kExitInterrupted
  RunStatus status = RunStatus::Finished;  ///< Finished, Failed, Killed (run_status_name: "FINISHED" …)
  /// What ended a Failed run (None otherwise), and for OutOfMemory the phase it was in and the
  /// last micro-batch size tried (0 outside the loop).
  FailureKind failure = FailureKind::None;
  std::optional<OomPhase> oom_phase;
  std::int64_t oom_micro_batch = 0;
  /// The run directory; empty when the run failed before training in a directory it had named
  /// itself that then held nothing but its log, config and status (it is removed: no empty
  /// run directories from failed starts).
  std::string run_dir;
  std::string message;  ///< why it failed, empty on success
  std::int64_t global_step = 0;
  std::int64_t epochs_completed = 0;
  std::map<std::string, double> final_metrics;  ///< last value of every metric
  std::string last_checkpoint;
  /// A run that stopped before its last epoch: who asked (a plugin's name,
  /// "training.max_steps", "signal") and why; empty when it ran to the end or failed.
  std::string stopped_by;
  std::string stop_reason;
};

/// The training loop: builds data, model and optimizer from the config, fires the events of
/// docs/events.md, trains with gradient accumulation, evaluates, checkpoints and resumes.
/// A failure never escapes fit(): it is logged, the run is marked FAILED, a checkpoint is
/// written when one can be, and the exit code says what happened.
class TRAINER_API Trainer {
 public:
  explicit Trainer(TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Runs to the end and reports how it ended. Call once.
  RunResult fit();

  /// The model after fit() (null before).
  std::shared_ptr<Model> model() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer
