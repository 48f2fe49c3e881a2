#pragma once
// Private: the points where the ranks of a data-parallel step agree, behind one interface, so
// that TrainStep reads the same in a run of one and in a rank group:
//
//   plan = sync.start_batch(skip, micro)   // after BatchStart: skip on all or none, one micro-batch
//   totals = sync.gradients(local)         // local forward/backward, then the gradients summed
//   skip = sync.before_step(local)         // local unscale/clip/reserve, then one skip for all
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
};

class StepSync {
 public:
  virtual ~StepSync() = default;

  /// What every rank does with the batch, agreed after BatchStart.
  struct BatchPlan {
    bool skip = false;             ///< the batch is skipped (on every rank)
    std::int64_t micro_batch = 1;  ///< the micro-batch every rank uses
  };
  /// After BatchStart: this rank's wish (`skip`, `micro_batch`) → what every rank does.
  virtual BatchPlan start_batch(bool skip, std::int64_t micro_batch) = 0;

  /// The samples an attempt covers, as plugins see it: this rank's `local` in a run of one; in
  /// a rank group the largest part any rank holds of a batch of `global` samples (so that every
  /// rank reports the same sizes).
  virtual std::int64_t attempt_samples(std::int64_t local, std::int64_t global) const = 0;

  /// Runs `local` (this rank's forward and backward) and returns the global batch's totals with
  /// the gradients summed over the ranks.
  virtual StepTotals gradients(const std::function<StepTotals()>& local) = 0;
  /// Just before the backward of an attempt's last micro-batch (a rank group may start the
  /// gradients' all-reduce inside it).
  virtual void before_last_backward() {}

  /// Runs `local` (what comes before optimizer.step(): unscaling, clipping, the reserve;
  /// returns whether this rank skips) and returns whether the step is skipped on every rank.
  virtual bool before_step(const std::function<bool()>& local) = 0;

  /// The ranks an out-of-memory retry agrees with; null in a run of one.
  virtual ProcessGroup* ranks() = 0;
};

/// A run of one: each point just runs its local part.
class LocalSync final : public StepSync {
 public:
  BatchPlan start_batch(bool skip, std::int64_t micro_batch) override { return {skip, micro_batch}; }
  std::int64_t attempt_samples(std::int64_t local, std::int64_t) const override { return local; }
  StepTotals gradients(const std::function<StepTotals()>& local) override { return local(); }
  bool before_step(const std::function<bool()>& local) override { return local(); }
  ProcessGroup* ranks() override { return nullptr; }
};

/// LocalSync for a run of one; the rank group's agreement (dist/rank_sync.h) when `parts` has
/// a process group.
std::unique_ptr<StepSync> make_step_sync(RunParts& parts, Hooks& hooks, OomRecovery& oom, TrainMetrics& metrics,
                                         spdlog::logger& log);

}  // namespace trainer
