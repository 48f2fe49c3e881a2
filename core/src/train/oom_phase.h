#pragma once
// The phases an out-of-memory error is recovered in (OomPhase, public in trainer/states.h), as
// one table: each phase's name (what OomInfo, status.json, the log and docs/events.md say),
// whether a smaller micro-batch can need less memory there, what to change when recovery gives
// up, and its code in the ranks' agreement.
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "trainer/memory.h"
#include "trainer/states.h"

namespace trainer {

struct OomPhaseInfo {
  OomPhase phase;
  const char* name;
  /// Whether a smaller micro-batch (eval batch) can need less memory here (OomInfo).
  bool micro_batch_helps;
  /// The code a data-parallel rank sends when its attempt failed here (0: not in a training
  /// step's agreement). Ordered so that the larger wins the ranks' max.
  std::int64_t wire_code;
  /// What to change when recovery gave up here (the run's failure message).
  const char* advice;
  /// What the memory allocated in this phase counts as, until the core attributes it by
  /// identity (parameters' gradients, optimizer state): memory_breakdown's categories.
  MemoryCategory allocates;
};

inline constexpr const char* kActivationAdvice =
    ", a smaller model, or a larger memory.limit_mb; mixed precision and activation checkpointing also cut "
    "activation memory (plugins mixed_precision, grad_checkpoint); trainer estimate predicts what fits";

inline constexpr std::array<OomPhaseInfo, 7> kOomPhaseTable = {{
    {OomPhase::Data, "data", false, 1,
     "the batch is read whole before it is split into micro-batches, so only a smaller training.batch_size (or more "
     "host memory) helps here",
     MemoryCategory::Batch},
    {OomPhase::Forward, "forward", true, 2, nullptr, MemoryCategory::Activations},
    {OomPhase::Backward, "backward", true, 3, nullptr, MemoryCategory::Other},
    {OomPhase::AllReduce, "all_reduce", false, 4,
     "a data-parallel rank keeps a flat copy of every gradient for their all-reduce, whatever the micro-batch or "
     "distributed.bucket_mb: a smaller model or a larger memory.limit_mb",
     MemoryCategory::Other},
    {OomPhase::OptimizerStep, "optimizer_step", false, 5,
     "parameters, gradients, optimizer state and the step's temporaries do not depend on the micro-batch: a smaller "
     "model, an optimizer with less state (sgd keeps none without momentum, adamw two tensors per parameter), a "
     "larger memory.limit_mb, or another device (plugins.oom_backoff.fallback_devices)",
     MemoryCategory::Other},
    {OomPhase::Eval, "eval", true, 0, nullptr, MemoryCategory::Evaluation},
    {OomPhase::Checkpoint, "checkpoint", false, 0, nullptr, MemoryCategory::Other},
}};

/// The table's row of `phase`.
const OomPhaseInfo& oom_phase_info(OomPhase phase);
/// The phase of a wire code; a code without a phase (0, or another build's) counts as the
/// forward, where a smaller micro-batch can help.
OomPhase oom_phase_of_wire(std::int64_t code);
/// What to change when out-of-memory recovery gave up in `phase`.
std::string_view oom_advice(OomPhase phase);

}  // namespace trainer
