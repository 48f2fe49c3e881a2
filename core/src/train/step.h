#pragma once
// Private: one training batch. It is split into micro-batches whose gradients accumulate to
// the gradient of the batch's mean loss; the optimizer step is atomic against out-of-memory
// errors; after the batch, the position says where a resume continues.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "train/oom_phase.h"
#include "trainer/context.h"
#include "trainer/control.h"
#include "trainer/core_settings.h"
#include "trainer/data.h"

namespace spdlog {
class logger;
}

namespace trainer {

class GradientSync;
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

  /// Trains one batch, the samples `indices` (BatchStart … AfterOptimizerStep). An
  /// out-of-memory error drops the attempt and, as the plugins ask, re-runs the same samples
  /// in other micro-batches. In a data-parallel run `indices` are this rank's part of a global
  /// batch of `global_size` samples: each sample's loss is divided by the global size and the
  /// gradients are summed over the ranks, so every rank steps with the global batch's mean
  /// gradient. `next` is the position once this batch is consumed. Returns whether an
  /// optimizer step was taken.
  bool run(const at::Tensor& indices, std::int64_t global_size, Position next);

  /// Control.micro_batch_size (BatchStart, BatchEnd): the micro-batch from now on, clamped to
  /// [1, batch_size].
  void resize(const Control& c);

  /// The batch after the last one consumed (trained or skipped).
  Position position() const { return position_; }
  void set_position(Position p) { position_ = p; }

  /// False after any failure inside optimizer.step() itself (out of memory past the reserve,
  /// an optimizer's error, a device error): the parameters may be partly updated, and must
  /// not be checkpointed.
  bool params_consistent() const { return params_consistent_; }

 private:
  /// The batch's loss, its correctly classified samples, and whether a plugin asked to skip.
  struct Accumulated {
    double loss = 0.0;
    std::int64_t correct = 0;
    bool skip = false;
  };
  /// Forward and backward over the micro-batches of `full`: the summed (batch-normalised) loss,
  /// the correct count and whether a plugin asked to skip the step.
  Accumulated accumulate(const Batch& full, const at::Tensor& indices, std::int64_t micro, std::int64_t global_size);
  /// Reads the batch (this rank's part) and runs accumulate() on it.
  Accumulated forward_backward(const at::Tensor& indices, std::int64_t micro, std::int64_t global_size);

  /// An out-of-memory error on this rank, held until the ranks agree on it.
  struct LocalOom {
    OomPhase phase;
    std::string message;
  };
  /// A data-parallel step's first half: forward_backward() and the gradients packed on every
  /// rank, one agreement (an out-of-memory error on any rank throws RanksOutOfMemory on all),
  /// then the gradients' all-reduce. Returns the global batch's loss, correct count and skip.
  Accumulated agreed_forward_backward(const at::Tensor& indices, std::int64_t micro, std::int64_t global_size);
  /// The second agreement, just before the optimizer step: throws RanksOutOfMemory on every
  /// rank when one failed since the first; returns whether any rank asks to skip the step.
  bool agree_before_step(const std::optional<LocalOom>& failed, bool skip);
  [[noreturn]] void throw_ranks_out_of_memory(const std::optional<LocalOom>& failed, std::int64_t rank,
                                              OomPhase phase);
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
  std::int64_t micro_batch_;         ///< the current micro-batch size
  std::int64_t reserve_ = 0;         ///< bytes the optimizer step may allocate for temporaries
  bool state_materialized_ = false;  ///< optimizer state created before the first step
  bool params_consistent_ = true;
  std::unique_ptr<GradientSync> sync_;  ///< a data-parallel run's gradient buckets
  bool overlap_reported_ = false;       ///< the first overlapped step was logged
  bool regraded_reported_ = false;      ///< a bucket reduced again was logged
  Position position_;
  Position next_;  ///< position_ once the current batch is consumed
};

}  // namespace trainer
