#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/error.h"
#include "trainer/export.h"
#include "trainer/model.h"
#include "trainer/plugin.h"

namespace trainer {

/// Everything a run needs besides its config.
struct TrainerOptions {
  /// Validated config with defaults filled (validate_recipe).
  Config config;
  /// Run directory; empty: `<run.dir>/<run.name>-<YYYYmmdd-HHMMSS>`.
  std::string run_dir;
  /// Checkpoint file or run directory to resume from; empty: start fresh.
  std::string resume;
  /// Plugins in load order (PluginHost::load, or in-process objects in tests).
  std::vector<std::shared_ptr<Plugin>> plugins;
  /// Install SIGINT/SIGTERM handlers: stop at the next safe point, checkpoint, exit 130.
  bool handle_signals = false;
  /// spdlog level name.
  std::string log_level = "info";
};

/// How a run ended.
struct RunResult {
  int exit_code = kExitOk;  ///< kExitOk, kExitUsage, kExitTrainingFailed, kExitNoDevice, kExitInterrupted
  std::string status;       ///< FINISHED, FAILED, KILLED
  std::string run_dir;
  std::string message;  ///< why it failed, empty on success
  std::int64_t global_step = 0;
  std::int64_t epochs_completed = 0;
  std::map<std::string, double> final_metrics;  ///< last value of every metric
  std::string last_checkpoint;
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

/// Asks every running Trainer in this process to stop at its next safe point as if
/// SIGINT had arrived (what the signal handler calls).
TRAINER_API void request_interrupt() noexcept;
/// True once SIGINT/SIGTERM arrived (or request_interrupt was called) and not cleared:
/// plugins that wait (device_select) poll it to stop waiting.
TRAINER_API bool interrupt_requested() noexcept;
/// Clears a pending interrupt request.
TRAINER_API void clear_interrupt() noexcept;

}  // namespace trainer

namespace trainer {

/// A recipe resolved and validated, with its plugins loaded and ready for a Trainer.
struct PreparedRun {
  Config config;
  std::vector<std::shared_ptr<Plugin>> plugins;
  std::vector<std::string> sources;  ///< config files merged, in order
};

/// Loads `recipe` with `overrides`, loads the plugins it names (searching `plugin_dirs`,
/// then the recipe's plugins.path, $TRAINER_PLUGIN_PATH and the default directories) and
/// validates everything. Throws ConfigError or PluginError (exit code 2).
TRAINER_API PreparedRun prepare_run(const std::string& recipe, const std::vector<std::string>& overrides,
                                    const std::vector<std::string>& plugin_dirs = {});

/// The config sections of `plugins`: `plugins.<name>` with each plugin's keys plus
/// `priority` and `policy`.
TRAINER_API std::vector<SectionSpec> plugin_config_sections(const std::vector<std::shared_ptr<Plugin>>& plugins);

}  // namespace trainer
