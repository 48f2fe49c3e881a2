#pragma once
// Private: one training batch. It is split into micro-batches whose gradients accumulate to
// the gradient of the batch's mean loss; the optimizer step is atomic against out-of-memory
// errors; after the batch, the position says where a resume continues.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "train/skipped_steps.h"
#include "train/step_sync.h"
#include "trainer/context.h"
#include "trainer/control.h"
#include "trainer/core_settings.h"
#include "trainer/data.h"

namespace spdlog {
class logger;
}

namespace trainer {

class Hooks;
class OomRecovery;
class TrainMetrics;
struct RunParts;

/// Where a resume continues: the epoch, and how many samples of that epoch's order are
/// consumed (trained or skipped). Counting samples, not batches, lets a resume with another
/// training.batch_size continue at exactly the next sample.
struct Position {
  std::int64_t epoch = 0;
  std::int64_t sample = 0;
};

class TrainStep {
 public:
  /// Needs the model and the optimizer built (it sizes the optimizer step's reserve).
  TrainStep(const TrainingSettings& training, RunParts& parts, RunState& state, Hooks& hooks, OomRecovery& oom,
            TrainMetrics& metrics, spdlog::logger& log);
  ~TrainStep();

  /// Trains one batch, the samples `indices`: BatchStart, then attempt() until one is not
  /// dropped for an out-of-memory error (the same samples again in the micro-batches the
  /// plugins ask), then AfterOptimizerStep. In a data-parallel run `indices` are this rank's part of a global
  /// batch of `global_size` samples: each sample's loss is divided by the global size and the
  /// gradients are summed over the ranks, so every rank steps with the global batch's mean
  /// gradient. `next` is the position once this batch is consumed. Returns whether an
  /// optimizer step was taken.
  bool run(const at::Tensor& indices, std::int64_t global_size, Position next);

  /// Control.micro_batch_size (BatchStart, BatchEnd): the micro-batch from now on, clamped to
  /// [1, batch_size].
  void apply_micro_batch_request(const Control& c);

  /// The batch after the last one consumed (trained or skipped).
  Position position() const { return position_; }
  void set_position(Position p) { position_ = p; }

  /// False after any failure inside optimizer.step() itself (out of memory past the reserve,
  /// an optimizer's error, a device error): the parameters may be partly updated, and must
  /// not be checkpointed.
  bool params_consistent() const { return params_consistent_; }

  /// The optimizer steps skipped for a NaN or infinite loss or gradient (training.on_nonfinite =
  /// "skip_step") in this process's run, and in a row now.
  const SkippedSteps& skipped() const { return skipped_; }
  /// At an epoch's end: one line saying how many steps the epoch skipped, when it skipped any.
  void end_epoch();

 private:
  /// BatchStart and the ranks' plan for the batch (StepSync::start_batch): returns false
  /// when the batch is skipped.
  bool start_batch(std::int64_t samples);
  /// How an attempt ended: the optimizer step skipped, or taken with the batch's loss and
  /// training statistics (Task::train_sums over its samples).
  struct AttemptResult {
    bool skipped = false;
    double loss = 0.0;
    std::vector<double> stats;
  };
  /// One attempt at the batch in micro-batches of `micro`: forward and backward (the gradients
  /// summed over the ranks), GradientsAccumulated … BeforeOptimizerStep, the optimizer step.
  /// Throws an out-of-memory error (RanksOutOfMemory in a rank group) for the retry.
  AttemptResult attempt(const at::Tensor& indices, std::int64_t micro, std::int64_t global_size);
  /// Reads the batch (this rank's part) and runs accumulate() on it.
  StepTotals forward_backward(const at::Tensor& indices, std::int64_t micro, std::int64_t global_size);
  /// Forward and backward over the micro-batches of `full`: the summed (batch-normalised) loss,
  /// the task's training statistics and whether a plugin asked to skip the step.
  StepTotals accumulate(const Batch& full, const at::Tensor& indices, std::int64_t micro, std::int64_t global_size);
  /// GradientsAccumulated, clipping, the non-finite check, the learning rate,
  /// BeforeOptimizerStep and prepare_step(), unless skipped (`skip` or a plugin's request);
  /// returns this rank's verdict.
  StepVerdict before_optimizer_step(bool skip);
  /// training.on_nonfinite, before the optimizer step: Step when the batch's loss and gradient
  /// norm are finite (or unchecked, "ignore"); else SkipNonfinite ("skip_step") or Diverge
  /// ("stop"), what it found kept in nonfinite_.
  StepVerdict nonfinite();
  /// The ranks agreed to skip for a NaN or infinity: counted, warned (SkippedSteps::warn_each),
  /// and past training.max_skipped_steps in a row the run fails (Diverged).
  void count_nonfinite_skip();
  /// "step 6 (epoch 2, batch 2)": the step being attempted.
  std::string where() const;
  /// What nonfinite() found, or that another rank found it.
  std::string found() const;
  /// The optimizer's state created and its temporaries reserved: after this, optimizer.step()
  /// has the memory it needs, so an out-of-memory error leaves parameters and optimizer state
  /// as they were.
  void prepare_step();
  /// optimizer.step() itself (after prepare_step()); a failure inside it leaves the parameters
  /// inconsistent.
  void take_step();
  /// The current batch is consumed: a resume continues after it.
  void advance() { position_ = next_; }

  const TrainingSettings& training_;
  RunParts& parts_;
  RunState& state_;
  Hooks& hooks_;
  OomRecovery& oom_;
  TrainMetrics& metrics_;
  spdlog::logger& log_;
  std::int64_t micro_batch_;  ///< the current micro-batch size
  std::int64_t reserve_ = 0;  ///< bytes the optimizer step may allocate for temporaries
  /// MemoryRungs::optimizer_changes() when reserve_ was computed (none yet: the largest value).
  std::uint64_t reserve_for_ = ~std::uint64_t{0};
  bool state_materialized_ = false;  ///< optimizer state created before the first step
  bool params_consistent_ = true;
  SkippedSteps skipped_;            ///< steps skipped for a NaN or infinite loss or gradient
  std::string nonfinite_;           ///< what nonfinite() found in this attempt ("the loss is NaN"), empty if nothing
  std::unique_ptr<StepSync> sync_;  ///< where the ranks agree (nothing to agree in a run of one)
  Position position_;
  Position next_;  ///< position_ once the current batch is consumed
};

}  // namespace trainer
