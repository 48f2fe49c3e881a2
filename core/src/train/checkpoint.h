#pragma once
// Private: checkpoints. Writing one (durably, retried once after an out-of-memory error),
// keeping the newest checkpoint.keep_last, the final checkpoint of a run, and resuming:
// finding a complete file, checking that it fits this run, and loading model, optimizer,
// position, counters and random generators.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/frozen_base.h"
#include "train/rank_generators.h"
#include "train/step.h"
#include "trainer/context.h"
#include "trainer/core_settings.h"
#include "trainer/plugin_state.h"

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace spdlog {
class logger;
}

namespace trainer {

class Config;
class Evaluator;
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

namespace detail {
/// The data order as a checkpoint records it: a line `key<TAB>value` each.
std::string data_order_text(const DataOrder& order);
/// The plugins' states as a checkpoint's "plugin_state" (nothing when there are none), and back.
void write_plugin_states(torch::serialize::OutputArchive& ar, const std::map<std::string, PluginState>& states);
std::map<std::string, PluginState> read_plugin_states(torch::serialize::InputArchive& ar);
}  // namespace detail

class Checkpointer {
 public:
  /// Writes into `dir` (the run's checkpoints/ directory); each checkpoint records `config`, the
  /// run's resolved config (TOML). With checkpoint.monitor, a checkpoint written at the step
  /// `evaluator` last evaluated is scored by that metric.
  Checkpointer(const CheckpointSettings& settings, std::string dir, DataOrder order, std::string config,
               RunParts& parts, RunState& state, Hooks& hooks, OomRecovery& oom, TrainMetrics& window,
               const Evaluator& evaluator, spdlog::logger& log);

  /// Writes `checkpoints/step_<global_step>.pt` recording that training continues at `next`,
  /// points `checkpoints/latest` at it, prunes old ones (prune()) and fires Checkpoint. Out of memory
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
  /// saved state (`info` says what was restored), and returns where to continue. A checkpoint of
  /// this run's own directory (resuming in place) is where the run goes on from: see
  /// adopt_checkpoints; it is not written again at the end when nothing was trained. Throws UsageError when none can be
  /// found, the file asked for is not complete, the data order would change, or it does not fit this model and
  /// optimizer (naming the parameter); trainer::Error when memory runs out while loading it.
  Position load(const std::string& path, ResumeInfo& info);

  /// The newest checkpoint written by this run ("" before the first), or the one it resumed from
  /// in place.
  const std::string& last() const { return last_; }

  /// After an evaluation (on every rank): throws UsageError when checkpoint.monitor is set and
  /// not among its metrics, naming those it has.
  void check_monitor() const;

  /// The resolved config the loaded checkpoint records ("" when it records none: an older one).
  const std::string& loaded_config() const { return loaded_config_; }

 private:
  void write(Position next, const GeneratorStates& generators);
  /// The model's tensors from the archive's "model": all of them, or (a checkpoint recording
  /// its frozen base) what trained, over a frozen base with the same digest.
  void restore_model(torch::serialize::InputArchive& ar, const std::string& file);
  /// Model, optimizer, position, counters and generators from a readable archive.
  Position restore(torch::serialize::InputArchive& ar, const std::string& file, ResumeInfo& info);
  /// The value of checkpoint.monitor for a checkpoint written now: the last evaluation's, when it
  /// evaluated this step and it is finite; nullopt otherwise (or without a monitor).
  std::optional<double> score_now() const;
  /// Keeps the newest checkpoint.keep_last; with a monitor, the save_top_k best scored ones and
  /// the newest (keep_last of them with save_last), and points `best` at the best.
  void prune();
  /// The scored checkpoints kept, best first (of equal scores, the older).
  std::vector<std::string> ranked() const;
  /// Points `best` at the first of `ranked` when it is not already.
  void point_at_best(const std::vector<std::string>& ranked);
  /// After loading `file` (continuing at `at`): when it is a checkpoint of this run's own
  /// directory, the run goes on from it (adopt_checkpoints; it is this run's last save).
  void go_on_from(const std::string& file, Position at);
  /// Throws UsageError naming every key of the data order that differs from `saved`.
  void check_data_order(const std::string& saved, const std::string& file) const;

  const CheckpointSettings& settings_;
  std::string dir_;
  DataOrder order_;
  std::string config_;
  std::string loaded_config_;
  RunParts& parts_;
  RunState& state_;
  Hooks& hooks_;
  OomRecovery& oom_;
  TrainMetrics& window_;
  spdlog::logger& log_;
  const Evaluator& evaluator_;
  std::vector<std::string> files_;        ///< written by this run and kept, oldest first
  std::map<std::string, double> scores_;  ///< of the files kept, those scored by checkpoint.monitor
  std::string best_;                      ///< the file `best` names
  std::string last_;
  std::int64_t saved_step_ = -1;  ///< global_step of the last save (written, or skipped out of memory)
  Position saved_position_;       ///< where the last save continues
  std::int64_t saves_ = 0;        ///< saves made together: names the ranks' exchanges of each
  detail::FrozenBaseDigest frozen_base_;
  std::string start_base_;  ///< the frozen weights' digest at the start when they are a file's; "" otherwise
  bool warned_base_ = false;
};

}  // namespace trainer
