#pragma once
// Private: the points where the ranks of a data-parallel step agree, behind one interface, so
// that TrainStep reads the same in a run of one and in a rank group:
//
//   plan = sync.start_batch(skip, micro)   // after BatchStart: skip on all or none, one micro-batch
//   totals = sync.gradients(local)         // local forward/backward, then the gradients summed
//   verdict = sync.before_step(local)      // local unscale/clip/checks/reserve, then one verdict for all
//
// In a run of one (LocalSync) each just runs its local part. The rank group's implementation
// (dist/rank_sync.h) holds an out-of-memory error of its local part until every rank has said
// how its part went, and then throws RanksOutOfMemory on every rank together, so that no rank
// is left waiting in a collective that another never joins.
#include <cstdint>
#include <functional>
#include <memory>

namespace spdlog {
class logger;
}

namespace trainer {

class Hooks;
class OomRecovery;
class ProcessGroup;
class TrainMetrics;
struct RunParts;

/// What the micro-batches of an attempt add up to: the (batch-normalised) loss, the task's
/// training statistics summed over the samples (Task::train_sums), and whether a plugin asked
/// to skip the optimizer step.
struct StepTotals {
  double loss = 0.0;
  std::vector<double> stats;
  bool skip = false;
  /// A task with sample weights (Task::sample_weights): this rank's weight of the batch, and
  /// what its micro-batches' losses were divided by (weight_denominator()).
  bool weighted = false;
  double weight = 0.0;
};

/// What becomes of an optimizer step, agreed by the ranks (the strongest wins).
enum class StepVerdict : std::uint8_t {
  Step = 0,  ///< take it
  Skip = 1,  ///< skip it: a plugin asked
  /// skip it: a non-finite loss or gradient with training.on_nonfinite = "skip_step" (counted
  /// toward training.max_skipped_steps on every rank alike)
  SkipNonfinite = 2,
  Diverge = 3,  ///< a non-finite loss or gradient with training.on_nonfinite = "stop": the run fails
};

class StepSync {
 public:
  virtual ~StepSync() = default;

  /// What every rank does with the batch, agreed after BatchStart.
  struct BatchPlan {
    bool skip = false;             ///< the batch is skipped (on every rank)
    std::int64_t micro_batch = 1;  ///< the micro-batch every rank uses
    /// Memory savers (Control::checkpointed_blocks, optimizer_moment_bits, optimizer_offload)
    /// every rank switches to: -1 and 0 when none is asked; offload 1 off, 2 on.
    std::int64_t checkpointed_blocks = -1;
    int moment_bits = 0;
    int offload = 0;
  };
  /// After BatchStart: this rank's wish (`skip`, `micro_batch`, the savers of `wish`) → what
  /// every rank does.
  virtual BatchPlan start_batch(bool skip, std::int64_t micro_batch, const BatchPlan& wish) = 0;

  /// The samples an attempt covers, as plugins see it: this rank's `local` in a run of one; in
  /// a rank group the largest part any rank holds of a batch of `global` samples (so that every
  /// rank reports the same sizes).
  virtual std::int64_t attempt_samples(std::int64_t local, std::int64_t global) const = 0;

  /// Runs `local` (this rank's forward and backward) and returns the global batch's totals with
  /// the gradients summed over the ranks, for a batch of `global_samples` samples on all ranks.
  virtual StepTotals gradients(const std::function<StepTotals()>& local, std::int64_t global_samples) = 0;

  /// A task with sample weights: what each micro-batch's weighted mean loss times its weight is
  /// divided by, given this rank's weight of the batch (`local_weight`). In a run of one, that
  /// weight (1 when it is 0), so the loss is the batch's weighted mean. In a rank group, whose
  /// weight is known only once the ranks agree, the same number on every rank: the global
  /// batch's samples times the global weight per sample of the last step (a guess of the
  /// global weight, so the backward sees losses of the usual size); gradients() then scales
  /// the summed gradients and loss by it over the global weight.
  virtual double weight_denominator(double local_weight, std::int64_t global_samples) const = 0;
  /// Just before the backward of an attempt's last micro-batch (a rank group may start the
  /// gradients' all-reduce inside it).
  virtual void before_last_backward() {}

  /// Runs `local` (what comes before optimizer.step(): unscaling, clipping, the non-finite
  /// check, the reserve; returns this rank's verdict) and returns every rank's: the strongest
  /// of them, so that all skip, or all fail, together.
  virtual StepVerdict before_step(const std::function<StepVerdict()>& local) = 0;

  /// The ranks an out-of-memory retry agrees with; null in a run of one.
  virtual ProcessGroup* ranks() = 0;
};

/// A run of one: each point just runs its local part.
class LocalSync final : public StepSync {
 public:
  BatchPlan start_batch(bool skip, std::int64_t micro_batch, const BatchPlan& wish) override {
    return {skip, micro_batch, wish.checkpointed_blocks, wish.moment_bits, wish.offload};
  }
  std::int64_t attempt_samples(std::int64_t local, std::int64_t) const override { return local; }
  StepTotals gradients(const std::function<StepTotals()>& local, std::int64_t) override { return local(); }
  double weight_denominator(double local_weight, std::int64_t) const override {
    return local_weight > 0 ? local_weight : 1.0;
  }
  StepVerdict before_step(const std::function<StepVerdict()>& local) override { return local(); }
  ProcessGroup* ranks() override { return nullptr; }
};

/// LocalSync for a run of one; the rank group's agreement (dist/rank_sync.h) when `parts` has
/// a process group.
std::unique_ptr<StepSync> make_step_sync(RunParts& parts, Hooks& hooks, OomRecovery& oom, TrainMetrics& metrics,
                                         spdlog::logger& log);

}  // namespace trainer
