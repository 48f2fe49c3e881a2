#pragma once
// Private: the memory savers a plugin switches on and off through Control (oom_backoff's
// ladder): activation checkpointing of the model's first N blocks, AdamW's moments in 32, 16 or
// 8 bits, and AdamW's moments offloaded to host memory. They are the run's state: RunState shows them to plugins,
// checkpoints keep them (a resume starts with the same savers on, before its optimizer state is read), and status.json
// lists them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace spdlog {
class logger;
}
namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize
namespace torch::optim {
class Optimizer;
}

namespace trainer {

class Hooks;
struct Control;
struct RunParts;
struct RunState;

class MemoryRungs {
 public:
  /// After set-up (model and optimizer made, ModelCreated fired): fills RunState's
  /// checkpointed_blocks, model_blocks, optimizer_moment_bits, configured_moment_bits and
  /// optimizer_offload.
  MemoryRungs(RunParts& parts, RunState& state, Hooks& hooks, spdlog::logger& log);

  /// Acts on `c.checkpointed_blocks`, `c.optimizer_moment_bits` and `c.optimizer_offload` (any
  /// may be unset); returns whether anything changed. `reason` goes into the log lines.
  bool apply(const Control& c, const std::string& reason);
  /// Checkpoints the first `blocks` of the blocks the core may wrap (those no plugin wraps), in
  /// forward order, and unwraps the rest of its own. Returns whether anything changed.
  bool set_checkpointed_blocks(std::int64_t blocks, const std::string& reason, bool metric = true);
  /// Converts the optimizer's moments to `bits` (32, 16 or 8), one parameter at a time.
  /// Returns whether the bits changed (an undo that ran out of memory changes nothing). Each
  /// change is logged, and with `metric` logged as memory/checkpointed_blocks or
  /// memory/optimizer_moment_bits at the current step.
  bool set_moment_bits(int bits, const std::string& reason, bool metric = true);
  /// Moves AdamW's moments to host memory (`on`) or back to the parameters' devices, one
  /// parameter at a time. Returns whether the place changed; logged, and with `metric` logged
  /// as memory/optimizer_offload (1 or 0).
  bool set_offload(bool on, const std::string& reason, bool metric = true);

  /// How many times the optimizer object was replaced (its moments changed bits or place).
  std::uint64_t optimizer_changes() const { return optimizer_changes_; }

  /// "6 of 12 blocks checkpointed; optimizer moments in 16 bits; optimizer moments in host
  /// memory" (what is on), "" when nothing.
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
  /// The optimizer's state in bytes: all of it, or (`device_only`) what is on its parameters' devices.
  std::int64_t state_bytes(bool device_only) const;
  /// With no AdamW moments the core may change (another optimizer, or a data-parallel run):
  /// warns that `request` ("optimizer_offload true") is ignored, and why, and returns true.
  bool without_adamw_moments(const std::string& request, const char* kept_in_data_parallel, const char* only,
                             const std::string& why) const;
  /// Puts `made` in the old optimizer's place everywhere.
  void replace_optimizer(std::unique_ptr<torch::optim::Optimizer> made);

  std::vector<bool> mine_;  ///< per block: whether the core may wrap it (no plugin did)
  std::uint64_t optimizer_changes_ = 0;
};

}  // namespace trainer
