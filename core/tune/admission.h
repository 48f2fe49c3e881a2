#pragma once
// Private to `trainer sweep`: what a memory estimate lets a trial do before it runs.
#include <cstdint>
#include <string>
#include <vector>

#include "estimate.h"

namespace trainer::tune {

/// What a trial's config asks of memory.
struct TrialShape {
  std::int64_t batch = 0, micro = 0;
  std::int64_t eval_batch = 0;          ///< eval.batch_size; 0 when the trial does not evaluate
  std::int64_t backoff_floor = 0;       ///< oom_backoff's min_micro_batch; 0 without oom_backoff
  std::int64_t eval_limit_batches = 0;  ///< eval.limit_batches (0: the whole test split)
};

/// The verdict.
struct Admission {
  bool run = true;
  std::vector<std::string> overrides;  ///< what the trial runs with besides its own (a lower micro-batch, eval batch)
  std::string reason;                  ///< why it is skipped, or what was lowered and why
  std::int64_t predicted_peak = -1;    ///< the run's predicted peak (bytes) as it will run; -1 unknown
};

/// Whether a trial of `shape` fits the budget or the device by `e`'s prediction (with its
/// margin). What does not fit is lowered where that changes no result the trial reports: the
/// evaluation batch (evaluation sums over its samples; with eval.limit_batches the batch is one
/// that divides the samples evaluated, and the limit is raised to keep them), and the
/// micro-batch when the
/// recipe loads oom_backoff (it would lower it after an out-of-memory error anyway; gradient
/// accumulation keeps the effective batch), not below its min_micro_batch. When no micro-batch
/// fits on its own, the cheapest configuration on oom_backoff's ladder that fits (blocks
/// checkpointed; AdamW's moments in host memory, probed on a GPU; in fewer bits where the trial
/// allows inexact rungs): the trial starts there (plugins.oom_backoff.start_checkpointed_blocks,
/// start_offload, start_moment_bits), reason "on the ladder: ...". Otherwise the trial is skipped: run = false, reason
/// "predicted out of memory: ...".
Admission admit_trial(const MemoryEstimate& e, const TrialShape& shape);

}  // namespace trainer::tune
