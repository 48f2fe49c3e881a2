#pragma once
// A few real training steps of a recipe, measured: the building block of `trainer estimate`
// (probe steps, --find-max-batch) and `trainer bench` (the cells of a grid). The run is a
// real Trainer run in this process, with its plugins, on the device they choose; only what
// would leave a trace is turned off (checkpoints, metric files, MLflow, the console plugin).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/memory.h"
#include "trainer/states.h"

namespace trainer::tune {

/// What to run: a recipe with the user's overrides, and what the measurement changes.
struct ShortRunSpec {
  std::string recipe;
  std::vector<std::string> overrides;    ///< the user's, as on the command line
  std::vector<std::string> plugin_dirs;  ///< --plugin-dir
  std::int64_t batch_size = 0;           ///< training.batch_size for the run; 0 = the recipe's
  std::int64_t micro_batch = 0;          ///< training.micro_batch_size for the run; 0 = the recipe's
  std::int64_t steps = 3;                ///< optimizer steps to run (training.max_steps)
  /// Keep memory.limit_mb / memory.fraction: false measures without a budget (probes), true
  /// runs inside it (--find-max-batch, bench cells).
  bool keep_budget = false;
  /// Keep oom_backoff: false makes an out-of-memory error end the run (a probe or a search
  /// step must see it), true lets it recover as in a real run (bench cells).
  bool keep_oom_backoff = false;
  /// After the steps, evaluate one batch (eval.at_end, eval.limit_batches = 1) and measure it;
  /// needs a recipe that evaluates (its test split loaded).
  bool evaluate = false;
  std::int64_t eval_batch = 0;  ///< that batch's size; 0 = the recipe's eval.batch_size
  /// Where the run's directory is made: `<work_dir>/trainer-<label>-XXXXXX`, by mkdtemp (a new
  /// name, mode 0700: this process's alone, never one found there), and removed with its
  /// contents after the run. Empty: $TMPDIR (std::filesystem::temp_directory_path). The run
  /// never resumes (checkpoint.autoresume is off).
  std::string work_dir;
  std::string label = "run";  ///< names the directory, e.g. "estimate-probe-8-8-0"
  /// Memory savers on from the first step, as oom_backoff's ladder switches them on
  /// (Control::checkpointed_blocks, Control::optimizer_moment_bits, Control::optimizer_offload):
  /// blocks the core checkpoints (-1: all the model has; 0: none), AdamW's moment bits (0: as
  /// configured) and its moments in host memory, streamed through each step.
  std::int64_t checkpointed_blocks = 0;
  int moment_bits = 0;
  bool offload = false;
};

/// Ctrl-C for a command made of short runs (`trainer estimate`, `trainer bench`): its signal
/// handler calls this (async-signal-safe) beside request_interrupt(). The run in progress
/// stops at its next step (its directory removed as always); unlike the run's interrupt flag,
/// which each run clears when it starts, this one stays set, so a signal between two runs is
/// not lost: the next run_short throws trainer::Interrupted instead of starting.
void request_stop() noexcept;
/// Installs SIGINT/SIGTERM handlers that call request_stop() and request_interrupt() (a second
/// signal kills the process the ordinary way), for the rest of the process.
void stop_on_signals();

/// One optimizer step as measured.
struct StepRecord {
  double seconds = 0.0;            ///< BatchStart to BatchEnd
  double optimizer_seconds = 0.0;  ///< of those, BeforeOptimizerStep to BatchEnd: the optimizer step
  std::int64_t samples = 0;        ///< samples of the batch
  std::int64_t peak = 0;           ///< highest allocated bytes on the device during the step
  /// Highest allocated during the forward and backward passes (BatchStart to
  /// BeforeOptimizerStep), and during the optimizer step (from there to BatchEnd): the peak is
  /// the larger; only the first grows with the micro-batch.
  std::int64_t peak_forward_backward = 0;
  std::int64_t peak_optimizer_step = 0;
  std::int64_t reserved = 0;     ///< reserved bytes at the step's end (CUDA: the caching allocator's)
  std::int64_t micro_batch = 0;  ///< micro-batch in use at the step's end
  /// The live memory by category at the step's highest point (memory categories on, the CPU).
  std::optional<MemoryBreakdown> split;
};

/// How the run went and what it held.
struct ShortRunResult {
  int exit_code = 0;
  RunStatus status = RunStatus::Finished;
  std::string message;  ///< why it failed
  std::string device;   ///< where it ran ("cpu", "cuda:0")
  std::vector<StepRecord> steps;
  bool out_of_memory = false;           ///< an OutOfMemory event fired
  std::optional<OomPhase> oom_phase;    ///< phase of the first out-of-memory error
  std::int64_t oom_micro_batch = 0;     ///< micro-batch of the first out-of-memory error
  std::int64_t parameter_bytes = 0;     ///< parameters and buffers of the model
  std::int64_t gradient_bytes = 0;      ///< parameters that require grad (their .grad)
  std::int64_t optimizer_bytes = 0;     ///< optimizer state after the steps
  std::int64_t allocated_at_start = 0;  ///< allocated at FitStart: model, optimizer, data held on the device
  std::int64_t allocated_before = 0;    ///< allocated in this process before the run
  std::int64_t train_samples = 0;       ///< size of the training set
  std::int64_t limit = 0;               ///< the budget in force on the device (0 = none)
  std::vector<std::string> plugins;     ///< plugins that ran, in order
  /// With ShortRunSpec::evaluate: the evaluation's samples (its batch), allocated when it began
  /// and its peak; 0 when it did not run.
  std::int64_t eval_samples = 0;
  std::int64_t eval_allocated_at_start = 0;
  std::int64_t eval_peak = 0;
  /// The memory savers as the last step ran (RunState): blocks checkpointed by the core of the
  /// model's blocks, AdamW's moment bits (0: another optimizer), its moments in host memory.
  std::int64_t checkpointed_blocks = 0, model_blocks = 0;
  int moment_bits = 0;
  bool optimizer_offload = false;
  /// Highest peak over the steps (0 without a step).
  std::int64_t peak() const;
  /// Highest peak of the forward and backward passes, of the optimizer step, over the steps.
  std::int64_t peak_forward_backward() const;
  std::int64_t peak_optimizer_step() const;
  /// Reserved at the end of the step with the highest peak.
  std::int64_t reserved() const;
};

/// Runs `spec`; never throws for a failed run (exit_code, message), throws ConfigError /
/// UsageError / PluginError for a recipe or overrides that do not load.
ShortRunResult run_short(const ShortRunSpec& spec);

/// The plugins a measured run leaves out, whatever the recipe says: they write outside the
/// run (mlflow) or print progress (console).
const std::vector<std::string>& unmeasured_plugins();

}  // namespace trainer::tune
