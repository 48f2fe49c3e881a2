#pragma once
/// The records a run writes into its directory, each with its one codec. status.json:
///
///   {"status":"FAILED","exit_code":3,"global_step":12,"epoch":0,"message":"…",
///    "last_checkpoint":"…","failure":"out_of_memory","phase":"backward","time":1764000000.5}
///
/// "exit_code" is null while RUNNING; "stopped_by" and "reason" are there when a plugin,
/// training.max_steps or a signal stopped the run before its last epoch; "failure" when the run
/// FAILED, and "phase" when it failed out of memory in a phase of the loop. Tools read the
/// failure, never the message's words.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "trainer/export.h"
#include "trainer/states.h"

namespace trainer {

/// status.json: the run's outcome so far.
struct RunStatusRecord {
  RunStatus status = RunStatus::Running;
  int exit_code = 0;  ///< written as null while Running
  std::int64_t global_step = 0;
  std::int64_t epoch = 0;  ///< the epoch the run was in, from 0
  std::string message;
  std::string last_checkpoint;
  /// A run that stopped before its last epoch: who asked ("early_stopping", "training.max_steps",
  /// "signal") and why. Both are left out when empty.
  std::string stopped_by;
  std::string reason;
  FailureKind failure = FailureKind::None;  ///< written for a Failed run
  std::optional<OomPhase> oom_phase;        ///< for an out-of-memory failure in a phase of the loop
  double time = NAN;                        ///< when it was written, seconds since the Unix epoch
};

/// status.json's text (one line and a newline).
TRAINER_API std::string encode_status(const RunStatusRecord& s);
/// Reads status.json's text: "status" must be one of the RunStatus names; a missing or
/// mistyped optional field keeps its default (an older trainer wrote no "failure"). Throws
/// Error saying what is wrong, to follow the file's name ("is not a JSON object").
TRAINER_API RunStatusRecord decode_status(std::string_view text);

}  // namespace trainer
