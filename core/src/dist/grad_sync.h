#pragma once
// Private: the gradients of a data-parallel step, in two halves around one agreement.
//
//   sync.pack(params);            // local: this rank's gradients into the buckets
//   auto a = sync.agree(...);     // one collective: loss, correct, skip, each rank's failure
//   if (a.failed_rank >= 0) ...   // a rank ran out of memory: every rank retries together
//   sync.reduce(scale);           // the buckets summed over the ranks (the only collectives)
//   sync.unpack(params);          // local again: back into the gradients
//
// The buckets are allocated once, at the first pack (as DDP's are): an out-of-memory error then
// happens before the agreement, on one rank, and is agreed like one in the backward, instead
// of leaving the other ranks inside an all-reduce that the failing rank never joins.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

class ProcessGroup;

/// The parameters that take part (require grad) as buckets of their indices: in parameter
/// order, one dtype per bucket (one flat tensor has one dtype), about `bucket_bytes` each. The
/// same on every rank: they depend on the parameters only, not on which have a gradient.
std::vector<std::vector<std::size_t>> gradient_buckets(const std::vector<at::Tensor>& params,
                                                       std::int64_t bucket_bytes);

class GradientSync {
 public:
  /// `params` fixes the buckets (in parameter order, by dtype, about `bucket_bytes` each).
  GradientSync(ProcessGroup& pg, const std::vector<at::Tensor>& params, std::int64_t bucket_bytes);

  /// Copies this rank's gradients into the buckets (zeros for a parameter without one) and
  /// notes which parameters have one. May throw out-of-memory the first time (the buckets).
  void pack(const std::vector<at::Tensor>& params);

  /// What the ranks agreed after the local half of a step.
  struct Agreed {
    double loss = 0.0;              ///< summed over the ranks
    std::int64_t correct = 0;       ///< summed over the ranks
    bool skip = false;              ///< any rank asked to skip the step
    std::int64_t failed_rank = -1;  ///< the lowest rank that failed, -1 when none did
    std::int64_t failed_phase = 0;  ///< its phase code (see phase_code)
  };
  /// One collective: every rank's loss, correct count, skip request, failure (a phase code, 0
  /// for none) and which parameters have a gradient. Call it on every rank, after pack() or
  /// after a failure in the local half.
  Agreed agree(double loss, std::int64_t correct, bool skip, std::int64_t failed_phase);

  /// Sums the buckets over the ranks and multiplies them by `scale`: every collective of the
  /// step's gradients, with nothing allocated. Call after an agree() that found no failure.
  void reduce(double scale);
  /// Writes the reduced buckets into the gradients of the parameters that have one on some rank
  /// (a parameter no rank graded keeps none, as in a run of one). Local: a parameter graded on
  /// another rank only gets a gradient allocated here.
  void unpack(const std::vector<at::Tensor>& params);

  /// The bytes the buckets hold (allocated at the first pack()).
  std::int64_t bucket_bytes() const;

 private:
  ProcessGroup& pg_;
  std::vector<std::vector<std::size_t>> buckets_;  ///< parameter indices per bucket
  std::vector<std::int64_t> numel_;                ///< elements per bucket
  std::vector<at::Tensor> flat_;                   ///< one flat tensor per bucket, once packed
  at::Tensor stats_;                               ///< [loss, correct, skip, failures..., has grad...]
};

/// The phases of a step's local half as numbers for the agreement (0 = no failure).
std::int64_t phase_code(const std::string& phase);
const char* phase_name(std::int64_t code);

}  // namespace trainer
