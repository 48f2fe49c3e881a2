#pragma once
// Private: the memory savers a plugin switches on and off through Control (oom_backoff's
// ladder): activation checkpointing of the model's first N blocks, and AdamW's moments in 32,
// 16 or 8 bits. They are the run's state: RunState shows them to plugins, checkpoints keep
// them (a resume starts with the same savers on, before its optimizer state is read), and
// status.json lists them.
#include <cstdint>
#include <string>
#include <vector>

namespace spdlog {
class logger;
}
namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace trainer {

class Hooks;
struct Control;
struct RunParts;
struct RunState;

class MemoryRungs {
 public:
  /// After set-up (model and optimizer made, ModelCreated fired): fills RunState's
  /// checkpointed_blocks, model_blocks, optimizer_moment_bits and configured_moment_bits.
  MemoryRungs(RunParts& parts, RunState& state, Hooks& hooks, spdlog::logger& log);

  /// Acts on `c.checkpointed_blocks` and `c.optimizer_moment_bits` (either may be unset);
  /// returns whether anything changed. `reason` goes into the log lines.
  bool apply(const Control& c, const std::string& reason);
  /// Checkpoints the first `blocks` of the blocks the core may wrap (those no plugin wraps), in
  /// forward order, and unwraps the rest of its own. Returns whether anything changed.
  bool set_checkpointed_blocks(std::int64_t blocks, const std::string& reason, bool metric = true);
  /// Converts the optimizer's moments to `bits` (32, 16 or 8), one parameter at a time.
  /// Returns whether the bits changed (an undo that ran out of memory changes nothing). Each
  /// change is logged, and with `metric` logged as memory/checkpointed_blocks or
  /// memory/optimizer_moment_bits at the current step.
  bool set_moment_bits(int bits, const std::string& reason, bool metric = true);

  /// How many times the optimizer object was replaced (its moments changed bits).
  std::uint64_t optimizer_changes() const { return optimizer_changes_; }

  /// "6 of 12 blocks checkpointed; optimizer moments in 16 bits" (what is on), "" when nothing.
  std::string summary() const;

  /// Into a checkpoint: the savers on (none written when none is).
  void save(torch::serialize::OutputArchive& ar) const;
  /// From a checkpoint `file`, before its optimizer state is loaded: switches on what it
  /// records; throws UsageError when the file records what this run cannot have.
  void restore(torch::serialize::InputArchive& ar, const std::string& file);

 private:
  RunParts& parts_;
  RunState& state_;
  Hooks& hooks_;
  spdlog::logger& log_;
  std::vector<bool> mine_;  ///< per block: whether the core may wrap it (no plugin did)
  std::uint64_t optimizer_changes_ = 0;
};

}  // namespace trainer
