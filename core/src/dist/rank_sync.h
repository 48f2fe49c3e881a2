#pragma once
// Private: the data-parallel step's agreement protocol (StepSync for a rank group). Three
// collectives per batch, each started on every rank:
//
//   1. after BatchStart: skip (any rank's) and the micro-batch (the smallest any rank asks);
//   2. after the local forward/backward and the gradients packed into their buckets: loss,
//      correct, skip and each rank's out-of-memory failure (GradientSync::agree), then the
//      buckets' all-reduce;
//   3. before optimizer.step(): an out-of-memory failure since 2 (unscaling, clipping, the
//      optimizer's state or reserve) and skip.
//
// A failure agreed in 2 or 3 throws RanksOutOfMemory on every rank with the phase of the lowest
// failing rank, so that every rank's plugins answer alike and OomRecovery retries on all.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "train/oom_phase.h"
#include "train/step_sync.h"

namespace trainer {

class GradientSync;
class Model;

class RankGroupSync final : public StepSync {
 public:
  /// `overlap`: start the buckets' all-reduce inside the backward; turned off (and logged) when
  /// `plugins_change_gradients` (a plugin handles AfterBackward, after an overlapped all-reduce
  /// would have sent them). The ranks agree on it, so that they all start the same collectives.
  /// `stats_width`: the task's training statistics summed over the ranks (Task::train_width());
  /// the agreement also sums each rank's sample weight (Task::sample_weights).
  RankGroupSync(ProcessGroup& group, Model& model, std::int64_t stats_width, std::int64_t bucket_bytes, bool overlap,
                bool plugins_change_gradients, OomRecovery& oom, TrainMetrics& metrics, spdlog::logger& log);
  ~RankGroupSync() override;

  BatchPlan start_batch(bool skip, std::int64_t micro_batch, const BatchPlan& wish) override;
  std::int64_t attempt_samples(std::int64_t local, std::int64_t global) const override;
  StepTotals gradients(const std::function<StepTotals()>& local, std::int64_t global_samples) override;
  double weight_denominator(double, std::int64_t global_samples) const override {
    return static_cast<double>(global_samples) * weight_per_sample_;
  }
  void before_last_backward() override;
  StepVerdict before_step(const std::function<StepVerdict()>& local) override;
  ProcessGroup* ranks() override { return &group_; }

 private:
  /// An out-of-memory error on this rank, held until the ranks agree on it.
  struct LocalOom {
    OomPhase phase;
    std::string message;
  };
  /// Every rank reports the failing rank's phase, so every rank's plugins answer alike.
  [[noreturn]] void throw_ranks_out_of_memory(const std::optional<LocalOom>& failed, std::int64_t rank, OomPhase phase);

  ProcessGroup& group_;
  Model& model_;
  OomRecovery& oom_;
  TrainMetrics& metrics_;
  spdlog::logger& log_;
  std::int64_t stats_width_;
  /// A weighted task: the global batch's weight per sample at the last agreement (1 before the
  /// first). Every rank holds the same, so it is the ranks' common denominator.
  double weight_per_sample_ = 1.0;
  std::unique_ptr<GradientSync> grads_;  ///< the gradients' buckets
  bool overlap_reported_ = false;        ///< the first overlapped step was logged
  bool regraded_reported_ = false;       ///< a bucket reduced again was logged
};

}  // namespace trainer
