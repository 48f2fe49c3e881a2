#pragma once
/// The records a run writes into its directory, each with its one codec: status.json,
/// metrics.jsonl's lines and a checkpoint's digest. status.json:
///
///   {"status":"FAILED","exit_code":3,"global_step":12,"epoch":0,"message":"…",
///    "last_checkpoint":"…","failure":"out_of_memory","phase":"backward","time":1764000000.5}
///
/// "exit_code" is null while RUNNING; "stopped_by" and "reason" are there when a plugin,
/// training.max_steps or a signal stopped the run before its last epoch; "failure" when the run
/// FAILED, "phase" when it failed out of memory in a phase of the loop and "micro_batch" when
/// it did so at a micro-batch size (the last one tried). "checkpointed_blocks",
/// "optimizer_moment_bits" and "optimizer_offload" are there when memory savers were on when it
/// was written (oom_backoff's ladder: blocks checkpointed by the core, AdamW's moments in other
/// bits than optim.name's, AdamW's moments in host memory). "skipped_steps" and
/// "skipped_in_a_row" are there once training.on_nonfinite = "skip_step" skipped a step.
/// Tools read these, never the message's words.
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
  std::int64_t micro_batch = 0;             ///< its last micro-batch size tried; 0: none
  std::int64_t checkpointed_blocks = 0;     ///< blocks the core checkpointed; 0: none (left out)
  int optimizer_moment_bits = 0;            ///< AdamW's moments' bits when not optim.name's; 0: left out
  bool optimizer_offload = false;           ///< AdamW's moments in host memory; false: left out
  /// Optimizer steps skipped for a NaN or infinite loss or gradient (training.on_nonfinite =
  /// "skip_step") in this process's run, and in a row when it was written; 0: both left out.
  std::int64_t skipped_steps = 0;
  std::int64_t skipped_in_a_row = 0;
  double time = NAN;  ///< when it was written, seconds since the Unix epoch
};

/// status.json's text (one line and a newline).
TRAINER_API std::string encode_status(const RunStatusRecord& s);
/// Reads status.json's text: "status" must be one of the RunStatus names; a missing or
/// mistyped optional field keeps its default (an older trainer wrote no "failure"). Throws
/// Error saying what is wrong, to follow the file's name ("is not a JSON object").
TRAINER_API RunStatusRecord decode_status(std::string_view text);

/// One line of metrics.jsonl:
///
///   {"step":12,"name":"train/loss","value":0.25,"time":1764000000.5}
///
/// A value that is not a finite number is written as "NaN", "Infinity" or "-Infinity"
/// (trainer/json.h); "time" is seconds since the Unix epoch.
struct MetricRecord {
  std::int64_t step = 0;
  std::string name;
  double value = 0;
  double time = NAN;
};

/// The line (with its newline).
TRAINER_API std::string encode_metric(const MetricRecord& m);
/// One line (without its newline); nullopt when it is not a metric: not a flat JSON object, no
/// integer-valued "step" an int64 holds, no non-empty "name" string, a "value" that is neither
/// a number nor one of the three names. A missing or mistyped "time" reads as NaN.
TRAINER_API std::optional<MetricRecord> decode_metric(std::string_view line);

/// A checkpoint's digest, `<checkpoint>.sum` beside it: its size and CRC-32, one line,
///
///   size 1234 crc32 0a1b2c3d
struct CheckpointDigest {
  std::int64_t size = 0;
  std::uint32_t crc32 = 0;
};

/// The file's text (with its newline).
TRAINER_API std::string encode_digest(const CheckpointDigest& d);
/// The first line of the file's text; nullopt when it is not a digest.
TRAINER_API std::optional<CheckpointDigest> decode_digest(std::string_view text);

}  // namespace trainer
