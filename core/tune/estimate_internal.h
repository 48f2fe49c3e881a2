#pragma once
// Private to `trainer estimate`: what estimate.cpp (the prediction, the search) and
// estimate_probes.cpp (the probes and the fit) share.
#include <cstdint>
#include <string>
#include <vector>

#include "estimate.h"
#include "trainer/core_settings.h"

namespace trainer::tune {

/// The recipe's batch and micro-batch, and the limit it runs under (or the device's).
struct RecipeFacts {
  std::int64_t batch = 0, micro = 0;
  std::int64_t eval_batch = 0;  ///< eval.batch_size when the run evaluates, else 0
  MemorySettings memory;
  bool memory_format_auto = false;  ///< model.memory_format = "auto": chosen by a timing probe in each run
  std::int64_t max_length = 0;      ///< dataset.max_length where the recipe's dataset has one, else 0
  bool model_trims = false;         ///< the model has trim_padding (bert): the probes turn it off
  /// The rungs of oom_backoff's ladder beyond the micro-batch that the recipe lets a run take
  /// (none without oom_backoff): checkpointing blocks, AdamW's moments in 16 and in 8 bits
  /// (allow_inexact), in host memory (offload; a GPU's); and its min_micro_batch (0 without
  /// oom_backoff).
  bool rung_checkpoint = false, rung_bf16 = false, rung_8bit = false, rung_offload = false;
  std::int64_t min_micro_batch = 0;
};

RecipeFacts recipe_facts(const EstimateRequest& r);

/// The overrides of a run at sequence length `len`: every batch padded to it, and a model that
/// cuts columns of padding computing over all of them (none for `len` 0).
std::vector<std::string> length_overrides(std::int64_t len, const RecipeFacts& facts);

std::int64_t usable(const MemoryEstimate& e);

/// Least squares for y = X w (LAPACK's gelsd); throws trainer::Error when the columns cannot be
/// told apart.
std::vector<double> least_squares(const std::vector<std::vector<double>>& X, const std::vector<double>& y);

/// A probe as run `r` measured it at (batch, micro-batch, length): its peaks, the savers it ran
/// with, and its step times (its fastest step after the first).
Probe probe_of(const ShortRunResult& r, std::int64_t batch, std::int64_t micro, std::int64_t length);
/// The time model (estimate.h) from the plain probes that ran.
void fit_times(MemoryEstimate& e);
/// The rungs of oom_backoff's ladder that `facts` allows, probed and fitted into `e`; `sizes`
/// the plain probes' micro-batches, `model_blocks` the blocks the core can checkpoint.
void probe_ladder(const EstimateRequest& request, const RecipeFacts& facts, const std::vector<std::int64_t>& sizes,
                  std::int64_t model_blocks, MemoryEstimate& e);

/// model.memory_format = "auto": each rung's terms in `e` as the larger of its own and `other`'s.
void keep_larger_rungs(MemoryEstimate& e, const MemoryEstimate& other);

/// The ladder's table at the recipe's (batch, micro-batch) and the cheapest configuration that
/// fits (MemoryEstimate::rungs, cheapest), from the fit and the rungs probed.
void set_ladder(MemoryEstimate& e);

/// Largest m in [1, cap] with f(m) <= budget; 0 when none. A scan, not a bisection: at a fixed
/// batch the prediction can fall as the micro-batch grows (c > b: the batch's samples beyond
/// the micro-batch cost more than the micro-batch's own), so f need not be monotonic.
template <class F>
std::int64_t largest_fitting(F f, std::int64_t budget, std::int64_t cap) {
  for (std::int64_t m = cap; m >= 1; --m) {
    if (f(m) <= budget) return m;
  }
  return 0;
}

/// What the limit caps (reserved on CUDA, allocated on the CPU), predicted at (batch, micro) at
/// the estimate's length, or at `len`.
std::int64_t limit_measure(const MemoryEstimate& e, std::int64_t batch, std::int64_t micro);
std::int64_t limit_measure(const MemoryEstimate& e, std::int64_t batch, std::int64_t micro, std::int64_t len);

}  // namespace trainer::tune
