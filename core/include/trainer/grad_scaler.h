#pragma once
// Dynamic loss scaling for float16 training, as PyTorch's torch.amp.GradScaler does it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "trainer/export.h"

namespace trainer {

/// GradScaler's settings (PyTorch's names and defaults).
struct GradScalerOptions {
  /// The first loss scale.
  double init_scale = 65536.0;
  /// The scale is multiplied by this after growth_interval consecutive steps with finite gradients.
  double growth_factor = 2.0;
  /// The scale is multiplied by this when a step's gradients hold an inf or a NaN.
  double backoff_factor = 0.5;
  /// Consecutive clean steps before the scale grows.
  std::int64_t growth_interval = 2000;
};

/// Dynamic loss scaling: float16 gradients of small magnitude underflow to zero, so the loss is
/// multiplied by a large scale before backward, the gradients divided by it before they are
/// used, and a step whose gradients overflowed (inf/NaN) is skipped while the scale backs off.
/// One optimizer step is:
///
///     scaler.scale(loss).backward()        (per micro-batch)
///     found_inf = scaler.unscale(params)   (once, before gradient clipping)
///     if (!found_inf) optimizer.step()
///     scaler.update()                      (once per step, taken or skipped)
///
/// PyTorch keeps the scale on the device to avoid a host sync; here it is a host double and
/// unscale() reads one flag back per step. unscale() runs the fused
/// `_amp_foreach_non_finite_check_and_unscale_` where the device has it (CUDA), and the same
/// computation in plain tensor ops elsewhere (LibTorch 1.13 has no CPU kernel for it).
class TRAINER_API GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  /// `loss` times the current scale (loss itself when the scale is 1).
  at::Tensor scale(const at::Tensor& loss) const;

  /// Divides every defined gradient of `params` by the scale, in place, and returns whether any
  /// of them holds an inf or a NaN (then the step must be skipped). Gradients of any floating
  /// dtype; the division runs in their dtype with 1/scale rounded to float32, as PyTorch does.
  /// Calling it twice before update() is an error (the gradients would be divided twice).
  bool unscale(const std::vector<at::Tensor>& params);

  /// Ends the step: after gradients with an inf/NaN the scale is multiplied by backoff_factor
  /// and the count of clean steps restarts; otherwise the count advances and, at
  /// growth_interval, the scale is multiplied by growth_factor (unless that overflows) and the
  /// count restarts. Without an unscale() since the last update, nothing is counted. A scale
  /// that backs off below float32's smallest value stays at that value (it never reaches 0).
  void update();

  /// Forgets an unscale() whose step is being redone (an out-of-memory retry recomputes the
  /// gradients): the next unscale() is allowed and only its outcome counts in update().
  void discard_unscale() { unscaled_ = false; }

  double get_scale() const { return scale_; }
  /// Consecutive clean steps since the scale last changed.
  std::int64_t growth_tracker() const { return growth_tracker_; }
  /// Whether the last unscale() found an inf or NaN.
  bool found_inf() const { return found_inf_; }
  const GradScalerOptions& options() const { return options_; }

  /// Restores a scale and growth count saved from get_scale() / growth_tracker(). Throws
  /// trainer::Error for a scale that is not a positive finite float32, or a negative count. A
  /// count at or past growth_interval grows the scale at the next clean step.
  void load(double scale, std::int64_t growth_tracker);

 private:
  GradScalerOptions options_;
  double scale_;
  std::int64_t growth_tracker_ = 0;
  bool unscaled_ = false;  ///< unscale() ran since the last update()
  bool found_inf_ = false;
};

}  // namespace trainer
