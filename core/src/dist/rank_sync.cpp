#include "dist/rank_sync.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "dist/grad_sync.h"
#include "train/oom_recovery.h"
#include "train/train_metrics.h"
#include "trainer/distributed.h"
#include "util/error_text.h"

namespace trainer {

namespace {

/// Adds the time of a data-parallel step's collectives to the window's dist/comm_s.
class CommTimer {
 public:
  explicit CommTimer(TrainMetrics& m) : m_(m) {}
  ~CommTimer() { m_.add_comm(std::chrono::duration<double>(TrainMetrics::Clock::now() - t0_).count()); }
  CommTimer(const CommTimer&) = delete;
  CommTimer& operator=(const CommTimer&) = delete;

 private:
  TrainMetrics& m_;
  TrainMetrics::Clock::time_point t0_ = TrainMetrics::Clock::now();
};

}  // namespace

RankGroupSync::RankGroupSync(ProcessGroup& group, Model& model, std::int64_t stats_width, std::int64_t bucket_bytes,
                             bool overlap, bool plugins_change_gradients, OomRecovery& oom, TrainMetrics& metrics,
                             spdlog::logger& log)
    : group_(group), model_(model), oom_(oom), metrics_(metrics), log_(log), stats_width_(stats_width) {
  // A plugin handling AfterBackward may change the gradients there (mixed_precision unscales
  // them), after an overlapped all-reduce would have sent them: then it waits for the
  // backward's end.
  if (overlap && plugins_change_gradients) {
    log_.info(
        "gradients: the all-reduce starts after the backward, not inside it: a plugin handles AfterBackward, "
        "where it may change them");
    overlap = false;
  }
  overlap = group_.all_reduce_max(overlap ? 0 : 1) == 0;
  // The task's statistics, then the sample weight and whether the task weighs (a rank without
  // samples cannot tell).
  grads_ = std::make_unique<GradientSync>(group_, model_.parameters(), bucket_bytes, overlap, stats_width + 2);
  log_.info("gradients: {} bucket{} of up to {:g} MiB{}", grads_->num_buckets(), grads_->num_buckets() == 1 ? "" : "s",
            static_cast<double>(bucket_bytes) / (1 << 20),
            overlap ? ", each all-reduced inside the backward once its gradients are complete (from the second step)"
                    : ", all-reduced after the backward");
}

RankGroupSync::~RankGroupSync() = default;

StepSync::BatchPlan RankGroupSync::start_batch(bool skip, std::int64_t micro_batch, const BatchPlan& wish) {
  // A data-parallel run skips a batch on every rank or on none (the others would wait in its
  // all-reduce), and every rank uses the smallest micro-batch any rank asks for (oom_backoff
  // growing back hears the same events on every rank, so they normally ask the same), the most
  // checkpointed blocks, the fewest moment bits and an offload any rank asks (the replicas'
  // optimizers stay alike).
  const auto agreed = [&] {
    CommTimer timer(metrics_);
    return group_.all_reduce_max({skip ? 1 : 0, -micro_batch, wish.checkpointed_blocks,
                                  wish.moment_bits > 0 ? 64 - wish.moment_bits : 0, wish.offload});
  }();
  if (-agreed[1] != micro_batch) log_.info("micro-batch {} -> {} (agreed by the ranks)", micro_batch, -agreed[1]);
  return {agreed[0] > 0, -agreed[1], agreed[2], agreed[3] > 0 ? static_cast<int>(64 - agreed[3]) : 0,
          static_cast<int>(agreed[4])};
}

std::int64_t RankGroupSync::attempt_samples(std::int64_t, std::int64_t global) const {
  return (global + group_.size() - 1) / group_.size();  // parts differ by one at most
}

void RankGroupSync::before_last_backward() { grads_->arm(); }

StepTotals RankGroupSync::gradients(const std::function<StepTotals()>& local, std::int64_t global_samples) {
  // The local half: this rank's forward and backward, its gradients into the buckets. An
  // out-of-memory error here is held until every rank has said how its half went: then all
  // drop the attempt together, and none is left waiting in an all-reduce.
  StepTotals mine;
  std::optional<LocalOom> failed;
  try {
    mine = local();
    oom_.enter(OomPhase::AllReduce);
    grads_->pack();
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    failed = LocalOom{oom_.phase(), detail::error_text(e)};
    drop_gradients(model_);
    // The buckets the other ranks start inside their backward, this rank starts too (as they
    // are: the attempt is dropped everywhere), so that none waits in a collective.
    if (grads_->overlapping()) {
      log_.info(
          "all-reduce: {} of {} buckets started inside the backward before it failed; the other {} start as "
          "they are, and every rank drops the attempt",
          grads_->started_in_backward(), grads_->num_buckets(), grads_->num_buckets() - grads_->started_in_backward());
    }
    grads_->abandon();
  }
  CommTimer timer(metrics_);
  std::vector<double> stats = mine.stats;
  stats.resize(static_cast<std::size_t>(stats_width_), 0.0);  // a rank without samples has none
  stats.push_back(mine.weight);
  stats.push_back(mine.weighted ? 1.0 : 0.0);
  auto agreed = grads_->agree(mine.loss, stats, mine.skip, failed ? oom_phase_info(failed->phase).wire_code : 0);
  if (agreed.failed_rank >= 0) {
    grads_->wait_started();
    throw_ranks_out_of_memory(failed, agreed.failed_rank, oom_phase_of_wire(agreed.failed_phase));
  }
  if (grads_->overlapping() && !overlap_reported_) {
    overlap_reported_ = true;
    log_.info("all-reduce: {} of {} buckets started inside the backward of the first overlapped step",
              grads_->started_in_backward(), grads_->num_buckets());
  }
  // Every rank steps with the global batch's mean gradient (each loss was divided by the
  // global batch), and reports the global batch's loss. With sample weights each loss was
  // divided by weight_denominator() (the global batch's samples times the last weight per
  // sample, the same on every rank): the sums are scaled to the global weight, known now.
  const bool weighted = agreed.stats.back() > 0;
  agreed.stats.pop_back();
  const double weight = agreed.stats.back();
  agreed.stats.pop_back();
  double scale = 1.0;
  if (weighted && weight > 0) {
    scale = weight_denominator(0.0, global_samples) / weight;
    weight_per_sample_ = weight / static_cast<double>(global_samples);
  }
  agreed.loss *= scale;
  {
    const auto t0 = TrainMetrics::Clock::now();
    grads_->reduce(scale);
    metrics_.add_all_reduce(std::chrono::duration<double>(TrainMetrics::Clock::now() - t0).count());
  }
  if (grads_->regraded() && !regraded_reported_) {
    regraded_reported_ = true;
    log_.warn(
        "all-reduce: a gradient was accumulated again after its bucket had started (a backward inside the "
        "backward?): every bucket is reduced again after the backward, at the cost of the overlap "
        "(distributed.overlap = false avoids the double work)");
  }
  return {agreed.loss, agreed.stats, agreed.skip};
}

StepVerdict RankGroupSync::before_step(const std::function<StepVerdict()>& local) {
  // After the gradients' all-reduce, before the optimizer step: a rank that ran out of memory
  // here (writing the reduced gradients back, a plugin's unscaling, clipping, the optimizer's
  // state or reserve) retries the batch with every other rank; a skip asked on any rank is
  // every rank's, and so is a divergence.
  StepVerdict verdict = StepVerdict::Step;
  std::optional<LocalOom> failed;
  try {
    grads_->unpack();
    verdict = local();
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    failed = LocalOom{oom_.phase(), detail::error_text(e)};
  }
  CommTimer timer(metrics_);
  const std::int64_t size = group_.size(), rank = group_.rank();
  // The lowest failing rank wins the max: (phase, size - 1 - rank).
  const std::int64_t code = failed ? oom_phase_info(failed->phase).wire_code * size + (size - 1 - rank) : 0;
  const auto agreed = group_.all_reduce_max({code, static_cast<std::int64_t>(verdict)});
  if (agreed[0] > 0) {
    drop_gradients(model_);
    throw_ranks_out_of_memory(failed, size - 1 - agreed[0] % size, oom_phase_of_wire(agreed[0] / size));
  }
  return static_cast<StepVerdict>(agreed[1]);
}

void RankGroupSync::throw_ranks_out_of_memory(const std::optional<LocalOom>& failed, std::int64_t rank,
                                              OomPhase phase) {
  oom_.enter(phase);
  if (failed) throw RanksOutOfMemory(fmt::format("on this rank ({}): {}", group_.rank(), failed->message));
  throw RanksOutOfMemory(
      fmt::format("rank {} ran out of memory in {} (every rank drops the attempt)", rank, oom_phase_name(phase)));
}

}  // namespace trainer
