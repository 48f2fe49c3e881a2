#pragma once
// Private: the epochs and batches of a run, and the safe points after each batch and each
// epoch where evaluation, checkpoints and stops take effect.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

#include "train/step.h"
#include "trainer/context.h"
#include "trainer/core_settings.h"

namespace trainer {

class Checkpointer;
class Evaluator;
class Hooks;
class TrainMetrics;
struct RunParts;

/// The settings the loop follows.
struct LoopSettings {
  TrainingSettings training;
  EvalSettings eval;
  CheckpointSettings checkpoint;
  std::int64_t seed = 0;  ///< run.seed: the shuffle order of each epoch
};

/// What stopped a run before its last epoch, weakest first: the value is the cause's strength
/// when the ranks of a data-parallel run agree on one (the strongest wins; a signal makes the
/// run KILLED on every rank).
enum class StopKind : std::uint8_t { MaxSteps = 1, Plugin = 2, Signal = 3 };

/// Why a run stopped before its last epoch.
struct StopCause {
  StopKind kind;
  std::string by;      ///< "training.max_steps", a plugin's name ("rank N" for another rank's), "signal"
  std::string reason;  ///< what it said
};

class EpochLoop {
 public:
  EpochLoop(const LoopSettings& settings, RunParts& parts, RunState& state, Hooks& hooks, TrainStep& step,
            Evaluator& evaluator, Checkpointer& checkpointer, TrainMetrics& window)
      : s_(settings),
        parts_(parts),
        state_(state),
        hooks_(hooks),
        step_(step),
        evaluator_(evaluator),
        checkpointer_(checkpointer),
        window_(window) {}

  /// Where training starts: the first sample of a fresh run, a checkpoint's position when
  /// resuming.
  void start_at(Position p);

  /// Trains from the start position to the last epoch, or to a stop at a safe point (a
  /// plugin's stop_training, training.max_steps, a signal; the steps since the last log are
  /// then logged). Returns why it stopped early, nullopt when it ran to the end.
  /// With eval.at_end, the model it ends with is evaluated (unless that step just was).
  std::optional<StopCause> run();

  /// Epochs whose end was reached (including those before a resume).
  std::int64_t epochs_completed() const { return epochs_completed_; }

 private:
  /// The epochs and their batches: run() without the evaluation at the end.
  std::optional<StopCause> train_epochs();
  /// Evaluates now and remembers the step it evaluated.
  void evaluate();
  /// After a batch: training metrics, a requested or eval.every_steps evaluation and checkpoint (after the epoch's
  /// last batch the checkpoint is left to end_epoch, so it holds what the epoch's end changed).
  void after_batch(bool stepped, bool last);
  /// Whether eval.every_epochs evaluates at the end of `epoch`.
  bool epoch_evaluates(std::int64_t epoch) const;
  /// After an epoch's batches: metrics, the epoch's evaluation, EpochEnd, its checkpoint.
  void end_epoch(std::int64_t epoch);
  /// Batches of an epoch of `n` samples still to train from sample `begin` of its order
  /// (training.drop_last drops a short last one).
  std::int64_t batches_left(std::int64_t n, std::int64_t begin) const;
  /// The index in its epoch of the batch starting at sample `begin`: counted back from the
  /// epoch's end, so that the last batch is steps_per_epoch - 1 even after a resume with
  /// another batch size.
  std::int64_t batch_index(std::int64_t n, std::int64_t begin) const;
  /// Why to stop now, if anything says so: this process's reason, or in a data-parallel run
  /// any rank's (the ranks agree, one collective).
  std::optional<StopCause> stop_reason() const;
  /// Why this process would stop: a signal, a plugin's stop, training.max_steps.
  std::optional<StopCause> local_stop_reason() const;
  /// This rank's part of a global batch (all of it in a run of one).
  at::Tensor local(const at::Tensor& batch) const;
  /// The epoch's sample order: a permutation seeded by run.seed and the epoch (or 0..n-1).
  at::Tensor epoch_order(std::int64_t epoch) const;

  const LoopSettings& s_;
  RunParts& parts_;
  RunState& state_;
  Hooks& hooks_;
  TrainStep& step_;
  Evaluator& evaluator_;
  Checkpointer& checkpointer_;
  TrainMetrics& window_;
  Position start_;
  std::int64_t epochs_completed_ = 0;
  bool checkpoint_due_ = false;     ///< checkpoint.every_steps fell on the epoch's last step
  std::int64_t evaluated_at_ = -1;  ///< global step of the last evaluation
};

}  // namespace trainer
