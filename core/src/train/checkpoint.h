#pragma once
// Private: checkpoints. Writing one (durably, retried once after an out-of-memory error),
// keeping the newest checkpoint.keep_last, the final checkpoint of a run, and resuming:
// finding a complete file, checking that it fits this run, and loading model, optimizer,
// position, counters and random generators.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/rank_generators.h"
#include "train/step.h"
#include "trainer/context.h"
#include "trainer/core_settings.h"

namespace torch::serialize {
class InputArchive;
}

namespace spdlog {
class logger;
}

namespace trainer {

class Config;
class Hooks;
class OomRecovery;
class TrainMetrics;
struct RunParts;

/// What decides the order in which a run visits its training samples, as `key`, value text:
/// run.seed, training.shuffle, training.drop_last, dataset.name, dataset.limit (when the
/// dataset has it), the number of training samples and, when grouping by length,
/// training.group_by_length, training.batch_size and the samples' `lengths` (their sum and an
/// FNV-1a hash). A resume that changed any of them would skip or repeat samples.
using DataOrder = std::vector<std::pair<std::string, std::string>>;
DataOrder data_order_of(const Config& cfg, std::int64_t train_samples, const at::Tensor& lengths);

class Checkpointer {
 public:
  /// Writes into `dir` (the run's checkpoints/ directory).
  Checkpointer(const CheckpointSettings& settings, std::string dir, DataOrder order, RunParts& parts, RunState& state,
               Hooks& hooks, OomRecovery& oom, TrainMetrics& window, spdlog::logger& log);

  /// Writes `checkpoints/step_<global_step>.pt` recording that training continues at `next`,
  /// points `checkpoints/latest` at it, prunes old ones and fires Checkpoint. Out of memory
  /// while writing: retried once after freeing memory, then skipped (logged; the run goes
  /// on). A second save at the same step and position writes nothing and fires nothing.
  /// Returns the newest checkpoint.
  ///
  /// In a data-parallel run every rank calls it at the same point (`together`): the checkpoint
  /// gets every rank's generator states, rank 0 writes it, and the others wait until it has,
  /// outside the collectives (not bounded by distributed.timeout_s; a rank 0 that stops
  /// answering is named). Not `together` (the run is failing and the ranks may not be in step),
  /// rank 0 writes alone, with its own generator state only.
  std::string save(Position next, bool together = true);

  /// The checkpoint at the end of a run (checkpoint.at_end), unless one exists for this step
  /// or the parameters are not consistent; `together` as for save(). Never throws: a failure is
  /// logged.
  void save_final(Position next, bool params_consistent, bool together);

  /// Loads a checkpoint file, or the newest complete one of a run directory (saying so when
  /// it passes over newer ones that are truncated or damaged), into model and optimizer;
  /// restores global_step, samples_seen and the random generators, hands the plugins their
  /// saved state (`info` says what was restored), and returns where to continue. Throws UsageError when none can be
  /// found, the file asked for is not complete, the data order would change, or it does not fit this model and
  /// optimizer (naming the parameter); trainer::Error when memory runs out while loading it.
  Position load(const std::string& path, ResumeInfo& info);

  /// The newest checkpoint written by this run ("" before the first).
  const std::string& last() const { return last_; }

 private:
  void write(Position next, const GeneratorStates& generators);
  /// Model, optimizer, position, counters and generators from a readable archive.
  Position restore(torch::serialize::InputArchive& ar, const std::string& file, ResumeInfo& info);
  /// Throws UsageError naming every key of the data order that differs from `saved`.
  void check_data_order(const std::string& saved, const std::string& file) const;

  const CheckpointSettings& settings_;
  std::string dir_;
  DataOrder order_;
  RunParts& parts_;
  RunState& state_;
  Hooks& hooks_;
  OomRecovery& oom_;
  TrainMetrics& window_;
  spdlog::logger& log_;
  std::vector<std::string> files_;  ///< written by this run and kept, oldest first
  std::string last_;
  std::int64_t saved_step_ = -1;  ///< global_step of the last save (written, or skipped out of memory)
  Position saved_position_;       ///< where the last save continues
  std::int64_t saves_ = 0;        ///< saves made together: names the ranks' exchanges of each
};

}  // namespace trainer
