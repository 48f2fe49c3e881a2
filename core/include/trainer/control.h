#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trainer {

/// The requests a Control can carry, one per field. Which event honours which is declared
/// once, in events.h (kEventTable); the core acts on a field only where it is honoured.
enum class ControlField : std::uint8_t {
  StopTraining,
  SkipStep,
  RetryWithMicroBatch,
  MicroBatchSize,
  SwitchDevice,
  CheckpointedBlocks,
  OptimizerMomentBits,
  OptimizerOffload,
  RequestCheckpoint,
  RequestEval,
};
inline constexpr std::size_t kNumControlFields = static_cast<std::size_t>(ControlField::RequestEval) + 1;

/// A set of ControlFields (bit i = ControlField i).
using ControlFields = std::uint16_t;
constexpr ControlFields bit(ControlField f) { return static_cast<ControlFields>(1u << static_cast<unsigned>(f)); }

/// One plugin's reason within a dispatch (Control::reasons).
struct ControlReason {
  std::string plugin;  ///< the plugin that wrote it
  std::string text;    ///< what it wrote into Control::reason
};

/// What plugins may ask of the core. A fresh Control is handed to every dispatch and shared
/// by all plugins of that dispatch (a later plugin sees, and may overwrite, what an earlier
/// one set); after all ran, the core acts on the fields the event honours (events.h,
/// kEventTable) and ignores the others: silently (skip_step, stop_training, request_*), or
/// with a warning in the log (retry_with_micro_batch, micro_batch_size, switch_device).
struct Control {
  /// Finish at the next safe point (after the current optimizer step), as a success.
  bool stop_training = false;
  /// Skip this batch's optimizer step (gradients are dropped). BatchStart..BeforeOptimizerStep.
  bool skip_step = false;
  /// Re-run the failed batch (or evaluation) with micro-batches of this size (OutOfMemory).
  std::optional<std::int64_t> retry_with_micro_batch;
  /// Use this micro-batch size from now on (BatchStart: already for this batch; BatchEnd:
  /// from the next one). Clamped to [1, batch_size]. How oom_backoff grows back.
  std::optional<std::int64_t> micro_batch_size;
  /// Use this device for the run ("cpu", "cuda:1"): SelectDevice chooses it; OutOfMemory
  /// moves the run there and retries.
  std::optional<std::string> switch_device;
  /// Checkpoint this many of the model's blocks (Model::blocks()), in forward order, from the
  /// retry (OutOfMemory) or this batch (BatchStart) on: activation checkpointing, exact. 0 =
  /// none; more than the blocks = all. Blocks another plugin wraps (grad_checkpoint) are left
  /// as they are and not counted. How oom_backoff's ladder checkpoints progressively.
  std::optional<std::int64_t> checkpointed_blocks;
  /// Keep AdamW's two moments in 32 bits (fp32), 16 (bf16) or 8 (block-wise 8-bit, as
  /// optim.name = "adamw8bit"), converting the optimizer state from the retry (OutOfMemory) or
  /// this batch (BatchStart) on. Not exact below 32. Only for optimizers "adamw" and
  /// "adamw8bit" (RunState::optimizer_moment_bits is 0 for others).
  std::optional<int> optimizer_moment_bits;
  /// Keep AdamW's moments in host memory (true), streamed a chunk at a time through each
  /// optimizer step, or on the parameters' devices (false), moving them from the retry
  /// (OutOfMemory) or this batch (BatchStart) on. Exact for fp32 parameters: the same
  /// operations on the same values (on the CPU, a tensor of more than 64 Ki values may round
  /// differently in its last bit, its operations running a chunk at a time). A bf16 or fp16
  /// parameter's moments go over widened to fp32 (the compact AdamW's form for them); float64
  /// parameters are refused. Saves the moments' device memory on a GPU; on the CPU, whose memory
  /// is the host's, nothing moves (the step still streams). Optimizers "adamw" and "adamw8bit"
  /// only, outside a data-parallel run.
  std::optional<bool> optimizer_offload;
  /// Write a checkpoint after the current batch.
  bool request_checkpoint = false;
  /// Run evaluation after the current batch.
  bool request_eval = false;
  /// Free text the core logs with the action: why this plugin asks. The core adds the
  /// plugin's name; a later plugin writing its own reason does not erase an earlier one's.
  std::string reason;
  /// Filled by the core after each plugin of the dispatch: every plugin that wrote `reason`,
  /// in the order they ran (read it, do not write it).
  std::vector<ControlReason> reasons;
  /// Filled by the core: the first plugin of this dispatch that set stop_training.
  std::string stopped_by;

  /// "oom_backoff: 8 did not fit; early_stopping: ..." (every plugin's reason), or "".
  std::string reasons_text() const {
    std::string out;
    for (const auto& r : reasons) out += (out.empty() ? "" : "; ") + r.plugin + ": " + r.text;
    return out;
  }
  /// The reason written by `plugin` in this dispatch ("" when none).
  std::string reason_of(const std::string& plugin) const {
    for (const auto& r : reasons) {
      if (r.plugin == plugin) return r.text;
    }
    return {};
  }

  /// True when field `f` is set.
  bool has(ControlField f) const {
    switch (f) {
      case ControlField::StopTraining:
        return stop_training;
      case ControlField::SkipStep:
        return skip_step;
      case ControlField::RetryWithMicroBatch:
        return retry_with_micro_batch.has_value();
      case ControlField::MicroBatchSize:
        return micro_batch_size.has_value();
      case ControlField::SwitchDevice:
        return switch_device.has_value();
      case ControlField::CheckpointedBlocks:
        return checkpointed_blocks.has_value();
      case ControlField::OptimizerMomentBits:
        return optimizer_moment_bits.has_value();
      case ControlField::OptimizerOffload:
        return optimizer_offload.has_value();
      case ControlField::RequestCheckpoint:
        return request_checkpoint;
      case ControlField::RequestEval:
        return request_eval;
    }
    return false;
  }
  /// Unsets field `f`.
  void clear(ControlField f) {
    switch (f) {
      case ControlField::StopTraining:
        stop_training = false;
        break;
      case ControlField::SkipStep:
        skip_step = false;
        break;
      case ControlField::RetryWithMicroBatch:
        retry_with_micro_batch.reset();
        break;
      case ControlField::MicroBatchSize:
        micro_batch_size.reset();
        break;
      case ControlField::SwitchDevice:
        switch_device.reset();
        break;
      case ControlField::CheckpointedBlocks:
        checkpointed_blocks.reset();
        break;
      case ControlField::OptimizerMomentBits:
        optimizer_moment_bits.reset();
        break;
      case ControlField::OptimizerOffload:
        optimizer_offload.reset();
        break;
      case ControlField::RequestCheckpoint:
        request_checkpoint = false;
        break;
      case ControlField::RequestEval:
        request_eval = false;
        break;
    }
  }

  bool any() const {
    return stop_training || skip_step || retry_with_micro_batch || micro_batch_size || switch_device ||
           checkpointed_blocks || optimizer_moment_bits || optimizer_offload || request_checkpoint || request_eval;
  }
};

}  // namespace trainer
