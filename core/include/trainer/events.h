#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "trainer/control.h"
#include "trainer/export.h"

namespace trainer {

/// Lifecycle events fired by the core. A run, with the events in CamelCase (docs/events.md
/// has what the context holds at each and worked examples):
///
///     configure() every plugin, in load order
///     Init
///     SelectDevice                      plugins choose the device; a memory budget is set
///     ModelCreated                      data loaded, model built (on the CPU, or read onto the device); replaceable
///     ModelToDevice                     the one move of the model to the device
///     OptimizerCreated
///     Resume                            (--resume only: the checkpoint and plugin states are loaded)
///     FitStart
///     for each epoch:
///         EpochStart
///         for each batch:
///             BatchStart                skip_step here skips the whole batch
///             attempt:                  (again after each OutOfMemory a plugin retries)
///                 for each micro-batch:
///                     BeforeForward, AfterForward, BeforeBackward, AfterBackward
///                 GradientsAccumulated  the batch's whole gradient, before clipping
///                 BeforeOptimizerStep   (not when the step is skipped)
///                 OutOfMemory           (only when the attempt ran out of memory: it
///                                        replaces the rest of the attempt)
///             AfterOptimizerStep        (not when the step is skipped)
///             BatchEnd
///             safe point: metrics; an evaluation and Checkpoint if requested (or
///                         checkpoint.every_steps); stop check (not after the epoch's last batch)
///         EvalStart                     (eval.every_epochs; again when an OOM retry restarts it)
///             EvalBatchStart, EvalBatchEnd   per evaluation batch
///         EvalMetrics                   plugins add their metrics; then all are logged together
///         EvalEnd
///         EpochEnd
///         Checkpoint                    (checkpoint.every_epochs)
///         stop check
///     Checkpoint                        (final, checkpoint.at_end)
///     FitEnd                            the loop ended: finished, stopped or interrupted
///     Shutdown                          always last
///
/// When an exception escapes between Init and FitEnd: the final Checkpoint (once FitStart
/// was reached), Exception, Shutdown. An evaluation or a checkpoint that runs out of memory
/// fires OutOfMemory inside it.
enum class Event : std::uint8_t {
  Init,                  ///< config parsed, run directory made, plugins configured
  SelectDevice,          ///< ctx.device proposes runtime.device; plugins may choose another
  ModelCreated,          ///< model built (on the CPU; a model.path "bert" on ctx.device); plugins may replace ctx.model
  ModelToDevice,         ///< model on ctx.device, in training mode (again after an OOM device fallback)
  OptimizerCreated,      ///< ctx.optimizer set; the LR schedule is built right after
  Resume,                ///< --resume: checkpoint loaded, plugin states handed back; ctx.resume says what
  FitStart,              ///< once, before the first epoch, after a --resume checkpoint was loaded
  EpochStart,            ///< state.epoch is the epoch starting (a resumed run's first may be partial)
  BatchStart,            ///< before the batch is read; once per batch whatever the retries
  BeforeForward,         ///< per micro-batch: ctx.batch, ctx.indices
  AfterForward,          ///< per micro-batch: also ctx.outputs and the scaled ctx.loss
  BeforeBackward,        ///< per micro-batch: just before loss.backward()
  AfterBackward,         ///< per micro-batch: its gradient is accumulated
  GradientsAccumulated,  ///< once per attempt: the batch's full gradient, before clipping
  BeforeOptimizerStep,   ///< gradient complete and clipped, LR set; may fire again after an OOM retry
  AfterOptimizerStep,    ///< the step was taken; global_step and samples_seen advanced
  BatchEnd,              ///< once per batch, skipped or not
  EvalStart,             ///< an evaluation on the test split begins (again after an OOM retry)
  EvalBatchStart,        ///< per evaluation batch: ctx.batch (on the device), ctx.indices
  EvalBatchEnd,          ///< per evaluation batch: also ctx.outputs and ctx.loss (the batch's mean loss)
  EvalMetrics,           ///< ctx.eval_metrics holds the core's results; plugins add theirs
  EvalEnd,               ///< ctx.eval_metrics holds all results (already logged)
  EpochEnd,              ///< after the epoch's batches and its evaluation, before its checkpoint
  Checkpoint,            ///< ctx.checkpoint_path was just written
  OutOfMemory,           ///< the failed attempt was dropped; ctx.oom says what failed
  FitEnd,                ///< the loop ended without an exception; ctx.status FINISHED or KILLED
  Exception,             ///< something escaped; ctx.exception holds it, ctx.status FAILED
  Shutdown,              ///< always last; ctx.status is the outcome
};

inline constexpr std::size_t kNumEvents = static_cast<std::size_t>(Event::Shutdown) + 1;

/// One row of kEventTable.
struct EventSpec {
  Event event;
  std::string_view name;
  bool closing;           ///< plugins run in reverse priority order, so handlers nest like wrappers
  ControlFields honours;  ///< the Control fields the core acts on after this event
};

namespace detail {
inline constexpr ControlFields kRequests =
    bit(ControlField::StopTraining) | bit(ControlField::RequestCheckpoint) | bit(ControlField::RequestEval);
inline constexpr ControlFields kSkip = bit(ControlField::SkipStep);
/// The memory savers oom_backoff's ladder switches on and off.
inline constexpr ControlFields kRungs = bit(ControlField::CheckpointedBlocks) | bit(ControlField::OptimizerMomentBits) |
                                        bit(ControlField::OptimizerOffload);
/// Inside an evaluation a new evaluation request would only repeat it.
inline constexpr ControlFields kStopOrCheckpoint =
    bit(ControlField::StopTraining) | bit(ControlField::RequestCheckpoint);
}  // namespace detail

/// Every event, in enum order, with whether it is a closing event and which Control fields
/// it honours. The core applies Control through this table and warns about ignored fields;
/// docs/events.md's table is checked against it. Requests (stop_training, request_eval,
/// request_checkpoint) take effect at the next safe point, so nothing honours them once the
/// loop is over (FitEnd, Exception, Shutdown).
inline constexpr std::array<EventSpec, kNumEvents> kEventTable = {{
    // clang-format off
    {Event::Init,                "Init",                false, detail::kRequests},
    {Event::SelectDevice,        "SelectDevice",        false, detail::kRequests | bit(ControlField::SwitchDevice)},
    {Event::ModelCreated,        "ModelCreated",        false, detail::kRequests},
    {Event::ModelToDevice,       "ModelToDevice",       false, detail::kRequests},
    {Event::OptimizerCreated,    "OptimizerCreated",    false, detail::kRequests},
    {Event::Resume,              "Resume",              false, detail::kRequests},
    {Event::FitStart,            "FitStart",            false, detail::kRequests},
    {Event::EpochStart,          "EpochStart",          false, detail::kRequests},
    {Event::BatchStart,          "BatchStart",          false, detail::kRequests | detail::kSkip | bit(ControlField::MicroBatchSize) | detail::kRungs},
    {Event::BeforeForward,       "BeforeForward",       false, detail::kRequests | detail::kSkip},
    {Event::AfterForward,        "AfterForward",        true,  detail::kRequests | detail::kSkip},
    {Event::BeforeBackward,      "BeforeBackward",      false, detail::kRequests | detail::kSkip},
    {Event::AfterBackward,       "AfterBackward",       true,  detail::kRequests | detail::kSkip},
    {Event::GradientsAccumulated, "GradientsAccumulated", false, detail::kRequests | detail::kSkip},
    {Event::BeforeOptimizerStep, "BeforeOptimizerStep", false, detail::kRequests | detail::kSkip},
    {Event::AfterOptimizerStep,  "AfterOptimizerStep",  true,  detail::kRequests},
    {Event::BatchEnd,            "BatchEnd",            true,  detail::kRequests | bit(ControlField::MicroBatchSize)},
    {Event::EvalStart,           "EvalStart",           false, detail::kRequests},
    {Event::EvalBatchStart,      "EvalBatchStart",      false, detail::kStopOrCheckpoint},
    {Event::EvalBatchEnd,        "EvalBatchEnd",        true,  detail::kStopOrCheckpoint},
    {Event::EvalMetrics,         "EvalMetrics",         false, detail::kStopOrCheckpoint},
    {Event::EvalEnd,             "EvalEnd",             true,  detail::kRequests},
    {Event::EpochEnd,            "EpochEnd",            true,  detail::kRequests},
    {Event::Checkpoint,          "Checkpoint",          false, detail::kRequests},
    {Event::OutOfMemory,         "OutOfMemory",         false, detail::kRequests | bit(ControlField::RetryWithMicroBatch) | bit(ControlField::SwitchDevice) | detail::kRungs},
    {Event::FitEnd,              "FitEnd",              true,  0},
    {Event::Exception,           "Exception",           false, 0},
    {Event::Shutdown,            "Shutdown",            true,  0},
    // clang-format on
}};

/// One row of kControlFieldTable.
struct ControlFieldSpec {
  ControlField field;
  std::string_view name;  ///< the Control member
  /// Set by an event that does not honour it: a warning in the log (else cleared silently).
  bool warn_when_ignored;
};

/// Every Control field, in enum order.
inline constexpr std::array<ControlFieldSpec, kNumControlFields> kControlFieldTable = {{
    {ControlField::StopTraining, "stop_training", false},
    {ControlField::SkipStep, "skip_step", false},
    {ControlField::RetryWithMicroBatch, "retry_with_micro_batch", true},
    {ControlField::MicroBatchSize, "micro_batch_size", true},
    {ControlField::SwitchDevice, "switch_device", true},
    {ControlField::CheckpointedBlocks, "checkpointed_blocks", true},
    {ControlField::OptimizerMomentBits, "optimizer_moment_bits", true},
    {ControlField::OptimizerOffload, "optimizer_offload", true},
    {ControlField::RequestCheckpoint, "request_checkpoint", false},
    {ControlField::RequestEval, "request_eval", false},
}};

/// Every event, in firing order (for plugins that subscribe to all of them).
TRAINER_API std::vector<Event> all_events();
/// "BatchStart" etc.
TRAINER_API std::string_view event_name(Event e) noexcept;
/// Inverse of event_name; nullopt for an unknown name.
TRAINER_API std::optional<Event> event_from_name(std::string_view name) noexcept;
/// Closing events (After*, *End, Shutdown) run plugins in reverse priority order so that
/// a plugin's opening and closing handlers nest like wrappers.
TRAINER_API bool is_closing_event(Event e) noexcept;
/// True when the core acts on Control field `f` after event `e` (kEventTable).
TRAINER_API bool honours(Event e, ControlField f) noexcept;
/// "retry_with_micro_batch" etc.
TRAINER_API std::string_view control_field_name(ControlField f) noexcept;

}  // namespace trainer
