#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace trainer {

/// What plugins may ask of the core. A fresh Control is handed to every dispatch and shared
/// by all plugins of that dispatch (a later plugin sees, and may overwrite, what an earlier
/// one set); after all ran, the core acts on it. docs/events.md says which fields each
/// event honours; the others are ignored (switch_device and retry_with_micro_batch log a
/// warning when ignored).
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
  /// Use this device for the run ("cpu", "cuda:1"); honoured in SelectDevice.
  std::optional<std::string> switch_device;
  /// Write a checkpoint after the current batch.
  bool request_checkpoint = false;
  /// Run evaluation after the current batch.
  bool request_eval = false;
  /// Free text the core logs with the action ("who asked and why").
  std::string reason;

  bool any() const {
    return stop_training || skip_step || retry_with_micro_batch || micro_batch_size || switch_device ||
           request_checkpoint || request_eval;
  }
};

}  // namespace trainer
