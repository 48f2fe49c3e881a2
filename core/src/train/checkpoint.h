#pragma once
// Private: checkpoints. Writing one (atomically, retried once after an out-of-memory error),
// keeping the newest checkpoint.keep_last, the final checkpoint of a run, and resuming:
// finding the file and loading model, optimizer, position, counters and RNG.
#include <cstdint>
#include <string>
#include <vector>

#include "train/step.h"
#include "trainer/context.h"
#include "trainer/core_settings.h"

namespace spdlog {
class logger;
}

namespace trainer {

class Hooks;
class OomRecovery;
class TrainMetrics;
struct RunParts;

class Checkpointer {
 public:
  /// Writes into `dir` (the run's checkpoints/ directory).
  Checkpointer(const CheckpointSettings& settings, std::string dir, RunParts& parts, RunState& state, Hooks& hooks,
               OomRecovery& oom, TrainMetrics& window, spdlog::logger& log);

  /// Writes `checkpoints/step_<global_step>.pt` recording that training continues at `next`,
  /// points `checkpoints/latest` at it, prunes old ones and fires Checkpoint. Out of memory
  /// while writing: retried once after freeing memory, then skipped (logged; the run goes
  /// on). Returns the newest checkpoint.
  std::string save(Position next);

  /// The checkpoint at the end of a run (checkpoint.at_end), unless one exists for this step
  /// or the parameters are not consistent. Never throws: a failure is logged.
  void save_final(Position next, bool params_consistent);

  /// Loads a checkpoint file or the latest one of a run directory into model and optimizer,
  /// restores global_step, samples_seen and the CPU RNG, and returns where to continue.
  /// Throws UsageError when it cannot be found or does not fit this model and optimizer.
  Position load(const std::string& path);

  /// The newest checkpoint written by this run ("" before the first).
  const std::string& last() const { return last_; }

 private:
  void write(Position next);

  const CheckpointSettings& settings_;
  std::string dir_;
  RunParts& parts_;
  RunState& state_;
  Hooks& hooks_;
  OomRecovery& oom_;
  TrainMetrics& window_;
  spdlog::logger& log_;
  std::vector<std::string> files_;  ///< written by this run and kept, oldest first
  std::string last_;
  std::int64_t last_step_ = -1;  ///< global_step of last_
};

}  // namespace trainer
