#include "trainer/grad_scaler.h"

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <utility>

#include "trainer/error.h"

namespace trainer {

namespace {

/// PyTorch keeps the scale in a float32 tensor: every value it takes is rounded to float32.
double as_float32(double v) { return static_cast<double>(static_cast<float>(v)); }

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(as_float32(options.init_scale)) {
  TRAINER_CHECK(std::isfinite(scale_) && scale_ > 0, "GradScaler init_scale ", options_.init_scale,
                " must be > 0 and within float32's range (the scale is a float32, as in PyTorch)");
  TRAINER_CHECK(options_.growth_factor > 1.0 && std::isfinite(options_.growth_factor), "GradScaler growth_factor ",
                options_.growth_factor, " must be > 1");
  TRAINER_CHECK(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0, "GradScaler backoff_factor ",
                options_.backoff_factor, " must be in (0, 1)");
  TRAINER_CHECK(options_.growth_interval > 0, "GradScaler growth_interval ", options_.growth_interval, " must be > 0");
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const { return scale_ == 1.0 ? loss : loss * scale_; }

bool GradScaler::unscale(const std::vector<at::Tensor>& params) {
  TRAINER_CHECK(!unscaled_,
                "GradScaler::unscale() was already called for this step: the gradients would be "
                "divided twice (call update() after each step, or discard_unscale() to redo one)");
  unscaled_ = true;
  // As PyTorch: the reciprocal in double, rounded to float32.
  const double inv_scale = as_float32(1.0 / scale_);
  // Gradients grouped by device and dtype: the fused kernel takes one device and dtype per call.
  std::map<std::pair<std::string, c10::ScalarType>, std::vector<at::Tensor>> groups;
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    TRAINER_CHECK(!g.is_sparse(), "GradScaler: sparse gradients are not supported");
    groups[{g.device().str(), g.scalar_type()}].push_back(g);
  }
  std::vector<at::Tensor> flags;  // one 0-dim flag per group, read back together
  for (auto& [key, grads] : groups) {
    const c10::Device device = grads.front().device();
    if (device.is_cuda()) {
      at::Tensor found = at::zeros({1}, at::TensorOptions(at::kFloat).device(device));
      const at::Tensor inv = at::full({1}, inv_scale, at::TensorOptions(at::kFloat).device(device));
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found, inv);
      flags.push_back(found.squeeze(0).gt(0).to(at::kCPU));
      continue;
    }
    // LibTorch 1.13 has no CPU kernel for the fused op: the same steps in plain ops. The check
    // looks at the scaled values, before the division, as the fused kernel does.
    std::vector<at::Tensor> bad;
    bad.reserve(grads.size());
    for (auto& g : grads) {
      bad.push_back(at::isfinite(g).all().logical_not());
      if (inv_scale != 1.0) g.mul_(inv_scale);
    }
    flags.push_back(at::stack(bad).any().to(at::kCPU));
  }
  found_inf_ = !flags.empty() && at::stack(flags).any().item<bool>();
  return found_inf_;
}

void GradScaler::update() {
  if (!unscaled_) return;
  unscaled_ = false;
  if (found_inf_) {
    const double next = as_float32(scale_ * options_.backoff_factor);
    if (next > 0) scale_ = next;
    growth_tracker_ = 0;
    return;
  }
  // >= rather than PyTorch's ==: a count restored from a run with a longer interval still grows.
  if (++growth_tracker_ >= options_.growth_interval) {
    const float grown = static_cast<float>(scale_ * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

void GradScaler::load(double scale, std::int64_t growth_tracker) {
  const double rounded = as_float32(scale);
  TRAINER_CHECK(std::isfinite(rounded) && rounded > 0, "GradScaler: a saved scale of ", scale,
                " is not a positive float32");
  TRAINER_CHECK(growth_tracker >= 0, "GradScaler: a saved growth count of ", growth_tracker, " is negative");
  scale_ = rounded;
  growth_tracker_ = growth_tracker;
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace trainer
