#pragma once
/// The run's states as types: the phase an out-of-memory error happened in, a run's status and
/// what kind of failure ended it. Each is an enum backed by one table in the core; the names
/// below are what status.json, the logs, MLflow and docs/events.md say, and where a name is
/// read back (status.json, a journal) it is parsed with the `*_named` function.
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string_view>

#include "trainer/export.h"

namespace trainer {

/// Where an out-of-memory error happened (OomInfo::phase, status.json's "phase").
enum class OomPhase : std::uint8_t {
  Data,           ///< "data": reading the batch (whole, before it is split into micro-batches)
  Forward,        ///< "forward": a micro-batch's forward and loss
  Backward,       ///< "backward": a micro-batch's backward
  AllReduce,      ///< "all_reduce": a data-parallel rank's gradient buckets
  OptimizerStep,  ///< "optimizer_step": unscaling, clipping, the optimizer's state and reserve
  Eval,           ///< "eval": an evaluation batch
  Checkpoint,     ///< "checkpoint": writing a checkpoint
};
/// "optimizer_step".
TRAINER_API const char* oom_phase_name(OomPhase phase);
/// The phase named `name`; nullopt for a name that is none.
TRAINER_API std::optional<OomPhase> oom_phase_named(std::string_view name);
/// Whether a smaller micro-batch (eval batch) can need less memory in `phase`.
TRAINER_API bool oom_phase_micro_batch_helps(OomPhase phase);

/// How a run stands (status.json's "status"; the same names as MLflow's run statuses).
enum class RunStatus : std::uint8_t {
  Running,   ///< "RUNNING": not ended yet
  Finished,  ///< "FINISHED": ran to its end or was stopped by a plugin or training.max_steps
  Failed,    ///< "FAILED"
  Killed,    ///< "KILLED": interrupted (a signal), with a checkpoint to resume from
};
/// "FINISHED".
TRAINER_API const char* run_status_name(RunStatus status);
/// The status named `name`; nullopt for a name that is none.
TRAINER_API std::optional<RunStatus> run_status_named(std::string_view name);

/// What ended a FAILED run (status.json's "failure"), so that tools need not read the message.
enum class FailureKind : std::uint8_t {
  None,         ///< "none": the run did not fail
  OutOfMemory,  ///< "out_of_memory": not recovered from (status.json also says the phase)
  Usage,        ///< "usage": a configuration or usage error (exit code 2)
  NoDevice,     ///< "no_device": no device the run may use (exit code 4)
  Error,        ///< "error": any other error
  /// "diverged": a non-finite loss or gradient with training.on_nonfinite = "stop", or more than
  /// training.max_skipped_steps steps skipped in a row with "skip_step" (exit code 3)
  Diverged,
};
/// "out_of_memory".
TRAINER_API const char* failure_kind_name(FailureKind kind);
/// The kind named `name`; nullopt for a name that is none.
TRAINER_API std::optional<FailureKind> failure_kind_named(std::string_view name);

/// The names, for test output and logs.
TRAINER_API std::ostream& operator<<(std::ostream& os, OomPhase phase);
TRAINER_API std::ostream& operator<<(std::ostream& os, RunStatus status);
TRAINER_API std::ostream& operator<<(std::ostream& os, FailureKind kind);

}  // namespace trainer
