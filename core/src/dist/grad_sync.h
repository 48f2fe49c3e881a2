#pragma once
// Private: the gradients of a data-parallel step, in two halves around one agreement.
//
//   sync.arm();                   // before the backward of the attempt's last micro-batch
//   ... backward ...              // (overlap) a bucket whose gradients are done starts its all-reduce
//   sync.pack();                  // local: the rest of this rank's gradients into the buckets
//   // or, after an out-of-memory error in the local half: sync.abandon();
//   auto a = sync.agree(...);     // one collective: loss, task stats, skip, each rank's failure
//   if (a.failed_rank >= 0) { sync.wait_started(); ... }  // every rank retries together
//   sync.reduce(scale);           // the buckets summed over the ranks
//   sync.unpack();                // local again: back into the gradients
//
// The buckets are allocated once, at the first pack (as DDP's are): an out-of-memory error then
// happens before the agreement, on one rank, and is agreed like one in the backward, instead
// of leaving the other ranks inside an all-reduce that the failing rank never joins.
//
// Overlap (as DDP does it): once the buckets exist on every rank (after the first agreement
// without a failure), a hook on each parameter's gradient accumulator marks it done during the
// last micro-batch's backward; buckets start their all-reduce in a fixed order (bucket 0 holds
// the last parameters, whose gradients come first) as soon as they and the ones before them are
// done. A rank whose local half fails starts the buckets it has not started as they are
// (abandon), so that every rank has started the same collectives, in the same order, before
// the agreement that drops the attempt everywhere. A parameter whose gradient is accumulated
// again after its bucket started (reentrant checkpointing, a parameter in two graphs) makes
// every rank reduce all buckets again after the agreement, so the result is always the
// gradient the backward ended with.
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace trainer {

class ProcessGroup;

/// The parameters that take part (require grad) as buckets of their indices, in reverse
/// parameter order (the backward's order: bucket 0 is the one whose gradients are complete
/// first), one dtype per bucket (one flat tensor has one dtype). Bucket 0 holds about
/// min(1 MiB, `bucket_bytes`) (or the last parameter alone, when it is larger), so that the first
/// all-reduce starts early in the backward, the others about `bucket_bytes`. The same on every rank: they depend on the
/// parameters only, not on which have a gradient.
std::vector<std::vector<std::size_t>> gradient_buckets(const std::vector<at::Tensor>& params,
                                                       std::int64_t bucket_bytes);

class GradientSync {
 public:
  /// `params` fixes the buckets (see gradient_buckets). `overlap`: start the buckets' all-reduce
  /// inside the backward of an attempt's last micro-batch (hooks on the parameters' gradient
  /// accumulators), as soon as the buckets exist on every rank.
  /// `stats_width`: the task's training statistics agree() adds up (Task::train_width()).
  GradientSync(ProcessGroup& pg, const std::vector<at::Tensor>& params, std::int64_t bucket_bytes, bool overlap,
               std::int64_t stats_width);
  ~GradientSync();  ///< removes the hooks
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  /// Before the backward of an attempt's last micro-batch: from here until pack() or abandon(),
  /// a completed bucket starts its all-reduce (when overlapping).
  void arm();
  /// Copies this rank's gradients into the buckets not started yet (zeros for a parameter
  /// without one) and starts them when overlapping. May throw out-of-memory the first time (the
  /// buckets); then call abandon().
  void pack();
  /// After an error in the local half: starts the buckets not started yet, as they are, when
  /// overlapping (the other ranks start them too). Allocates nothing.
  void abandon();

  /// What the ranks agreed after the local half of a step.
  struct Agreed {
    double loss = 0.0;              ///< summed over the ranks
    std::vector<double> stats;      ///< the task's training statistics, summed over the ranks
    bool skip = false;              ///< any rank asked to skip the step
    std::int64_t failed_rank = -1;  ///< the lowest rank that failed, -1 when none did
    std::int64_t failed_phase = 0;  ///< its phase's wire code (train/oom_phase.h)
  };
  /// One collective: every rank's loss, training statistics, skip request, failure (a phase code, 0
  /// for none), which parameters have a gradient and whether a gradient changed after its
  /// bucket started. Call it on every rank, after pack() or abandon().
  Agreed agree(double loss, const std::vector<double>& stats, bool skip, std::int64_t failed_phase);

  /// Waits for the buckets started in this attempt (they are reused by the next one) and ends
  /// the attempt. Call it after an agree() that found a failure; reduce() calls it otherwise.
  void wait_started();
  /// The buckets summed over the ranks, multiplied by `scale`: waits for the started ones and
  /// reduces the others (all of them again when a gradient changed after its bucket started).
  /// Allocates nothing. Call after an agree() that found no failure.
  void reduce(double scale);
  /// Writes the reduced buckets into the gradients of the parameters that have one on some rank
  /// (a parameter no rank graded keeps none, as in a run of one). Local: a parameter graded on
  /// another rank only gets a gradient allocated here.
  void unpack();

  /// The bytes the buckets hold (allocated at the first pack()).
  std::int64_t bucket_bytes() const;
  /// Whether the all-reduce starts inside the backward (overlap asked, and the buckets exist).
  bool overlapping() const { return overlap_ && established_; }
  /// Buckets the last attempt started inside the backward, and all buckets.
  std::size_t started_in_backward() const { return started_in_backward_; }
  std::size_t num_buckets() const { return buckets_.size(); }
  /// Whether the last agreement found a gradient accumulated again after its bucket started
  /// (on some rank): reduce() then reduced every bucket again.
  bool regraded() const { return regraded_agreed_; }

 private:
  /// A parameter's gradient is accumulated (the hook of slot `slot`, autograd's thread).
  void on_accumulated(std::size_t slot);
  /// Copies bucket b's gradients in (zeros for a parameter without one).
  void fill(std::size_t b);
  /// Starts bucket b's all-reduce (the next in order).
  void start(std::size_t b);
  /// Starts the buckets from next_ on whose parameters are all accumulated (mutex_ held).
  void start_completed();
  /// Forgets the attempt (which parameters were accumulated, what started).
  void reset_attempt();

  ProcessGroup& pg_;
  std::vector<at::Tensor> params_;
  std::vector<std::vector<std::size_t>> buckets_;  ///< parameter indices per bucket
  std::vector<std::int64_t> numel_;                ///< elements per bucket
  std::vector<std::size_t> bucket_of_;             ///< the bucket of each slot
  std::vector<at::Tensor> flat_;                   ///< one flat tensor per bucket, once packed
  at::Tensor stats_;                               ///< [loss, skip, regraded, task stats..., failures..., has grad...]

  const bool overlap_;
  const std::int64_t stats_width_;  ///< the task's training statistics in stats_
  const std::int64_t failures_at_;  ///< where the ranks' failures start in stats_
  bool established_ = false;        ///< the buckets exist on every rank (an agreement without failure)
  bool regraded_agreed_ = false;
  std::atomic<bool> armed_{false};
  std::mutex mutex_;                          ///< the attempt's state below (hooks run on autograd's thread)
  std::vector<char> accumulated_;             ///< per slot, this attempt
  std::vector<std::int64_t> missing_;         ///< per bucket: slots not accumulated yet
  std::size_t next_ = 0;                      ///< the next bucket to start
  std::vector<std::function<void()>> waits_;  ///< per started bucket
  bool regraded_ = false;                     ///< a gradient accumulated again after its bucket started
  std::size_t started_in_backward_ = 0;

  struct Hook;
  std::vector<Hook> hooks_;
};

}  // namespace trainer
