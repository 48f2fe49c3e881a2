// mixed_precision: autocast around every forward and its loss (training and evaluation), and
// for float16 a GradScaler (dynamic loss scaling) through the core's general hooks: the loss is
// scaled in BeforeBackward (ctx.backward_loss) after every other plugin changed it, the
// gradients are unscaled and checked in the last micro-batch's AfterBackward (before
// GradientsAccumulated and clipping; a non-finite gradient skips the step), and the scale is
// updated once per batch in BatchEnd, so an out-of-memory retry of a batch counts once.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "trainer/error.h"
#include "trainer/grad_scaler.h"
#include "trainer/plugin.h"
#include "trainer/precision.h"
#include "trainer/settings.h"

namespace {

struct MixedPrecisionSettings : trainer::Settings<MixedPrecisionSettings> {
  std::string precision = "auto";
  std::string grad_scaler = "auto";
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;

  static void declare(trainer::SettingsSchema<MixedPrecisionSettings>& s) {
    s.add(&MixedPrecisionSettings::precision, "precision",
          "auto: bf16 where the device computes bfloat16 natively (CPU with AMX-BF16 or AVX512-BF16, GPU of "
          "compute capability 8.0+), else fp32; bf16/fp16: autocast to that type; fp32: off")
        .choices({"auto", "bf16", "fp16", "fp32"});
    s.add(&MixedPrecisionSettings::grad_scaler, "grad_scaler",
          "Dynamic loss scaling: auto = on with fp16 only; on; off")
        .choices({"auto", "on", "off"});
    s.add(&MixedPrecisionSettings::init_scale, "init_scale", "GradScaler: the first loss scale").min(0, false);
    s.add(&MixedPrecisionSettings::growth_factor, "growth_factor",
          "GradScaler: scale multiplier after growth_interval clean steps")
        .min(1, false);
    s.add(&MixedPrecisionSettings::backoff_factor, "backoff_factor",
          "GradScaler: scale multiplier after a step with inf/NaN gradients")
        .min(0, false)
        .max(1, false);
    s.add(&MixedPrecisionSettings::growth_interval, "growth_interval",
          "GradScaler: consecutive clean steps before the scale grows")
        .min(1);
  }
};

/// Autocast on for one forward; the guard restores the previous state when the core drops it.
class AutocastScope final : public trainer::ForwardScope {
 public:
  AutocastScope(c10::DeviceType type, c10::ScalarType dtype) : guard_(type, dtype) {}

 private:
  trainer::AutocastGuard guard_;
};

class MixedPrecisionPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "mixed_precision"; }
  std::string description() const override {
    return "Autocast (bf16/fp16) around forward and loss; GradScaler for fp16; auto picks bf16 only on native hardware";
  }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    // Once configured, the loss-scaling events only when a scaler can be needed (fp16 with
    // grad_scaler = "auto", or "on"): AfterBackward, where the scaler unscales the gradients, keeps a
    // data-parallel run from overlapping its all-reduce with the backward.
    if (configured_ && !(s_.grad_scaler == "on" || (s_.grad_scaler == "auto" && s_.precision == "fp16"))) {
      return {E::ModelToDevice, E::Resume, E::OutOfMemory, E::BatchEnd};
    }
    return {E::ModelToDevice, E::Resume, E::BeforeBackward, E::AfterBackward, E::OutOfMemory, E::BatchEnd};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return MixedPrecisionSettings::keys(); }
  // A precision the device cannot run is a usage error (exit code 2), and a scaler that fails
  // would train on unscaled gradients: the run must stop, not log and go on.
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }
  // Last among opening events, first among closing ones: BeforeBackward scales the loss after
  // every other plugin changed it (an auxiliary term is scaled too), and the last micro-batch's
  // AfterBackward unscales before other plugins look at the gradients there or later.
  int default_priority() const override { return 1000; }

  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = MixedPrecisionSettings::from(section);
    configured_ = true;
    trainer::GradScalerOptions o;
    o.init_scale = s_.init_scale;
    o.growth_factor = s_.growth_factor;
    o.backoff_factor = s_.backoff_factor;
    o.growth_interval = s_.growth_interval;
    options_ = o;
  }

  std::unique_ptr<trainer::ForwardScope> forward_scope(const trainer::EventContext&) override {
    if (!dtype_) return nullptr;
    return std::make_unique<AutocastScope>(device_type_, *dtype_);
  }

  void on_event(trainer::EventContext& ctx, trainer::Control& control) override {
    using E = trainer::Event;
    switch (ctx.event) {
      case E::ModelToDevice:
        resolve(ctx);
        break;
      case E::Resume:
        if (scaler_ && std::count(ctx.resume->restored_plugins.begin(), ctx.resume->restored_plugins.end(), name())) {
          logger_->info("mixed_precision: loss scale {} restored ({} clean steps of {} before growing)",
                        scaler_->get_scale(), scaler_->growth_tracker(), s_.growth_interval);
        }
        break;
      case E::BeforeBackward:
        if (scaler_) *ctx.backward_loss = scaler_->scale(*ctx.backward_loss);
        break;
      case E::AfterBackward:
        // Once per attempt, when the batch's gradient is complete.
        if (scaler_ && ctx.state.micro_batch_index + 1 == ctx.state.num_micro_batches &&
            scaler_->unscale(ctx.model->parameters())) {
          control.skip_step = true;
          control.reason =
              fmt::format("gradients hold inf/NaN at loss scale {:g}: step skipped, scale backs off to {:g}",
                          scaler_->get_scale(), scaler_->get_scale() * s_.backoff_factor);
          ++skipped_;
          inf_this_attempt_ = true;
          logger_->info("mixed_precision: {} (step {})", control.reason, ctx.state.global_step + 1);
        }
        break;
      case E::OutOfMemory:
        // The attempt's gradients are gone; the retry unscales its own, and only they count.
        if (scaler_) {
          if (inf_this_attempt_) --skipped_;
          inf_this_attempt_ = false;
          scaler_->discard_unscale();
        }
        break;
      case E::BatchEnd:
        if (scaler_) {
          inf_this_attempt_ = false;
          const double before = scaler_->get_scale();
          scaler_->update();
          // Once per step taken, and when the scale changed (a skipped step keeps the step number).
          if (ctx.state.global_step != logged_step_ || scaler_->get_scale() != before) {
            logged_step_ = ctx.state.global_step;
            ctx.metrics->log(ctx.state.global_step, {{"amp/loss_scale", scaler_->get_scale()},
                                                     {"amp/skipped_steps", static_cast<double>(skipped_)}});
          }
        }
        break;
      default:
        break;
    }
  }

  void save_state(trainer::PluginState& state) override {
    if (!scaler_) return;
    state.set_double("loss_scale", scaler_->get_scale());
    state.set_int("growth_tracker", scaler_->growth_tracker());
    state.set_int("skipped_steps", skipped_);
  }
  void load_state(const trainer::PluginState& state) override {
    // The scaler exists already when the run scales (ModelToDevice comes before load_state);
    // otherwise the values wait for one (a device fallback to a device that needs it).
    saved_scale_ = state.get_double("loss_scale", s_.init_scale);
    saved_tracker_ = state.get_int("growth_tracker", 0);
    skipped_ = state.get_int("skipped_steps", 0);
    if (scaler_) apply_saved();
  }

 private:
  /// Picks the precision for the run's device (again after an OOM device fallback).
  void resolve(const trainer::EventContext& ctx) {
    const c10::Device device = ctx.device;
    const bool first = !resolved_;
    resolved_ = true;
    std::string chosen = s_.precision, why;
    if (chosen == "auto") {
      chosen = trainer::native_bf16(device, &why) ? "bf16" : "fp32";
      why = "precision = auto: " + why;
    } else {
      why = "precision = " + s_.precision;
    }
    if (!device.is_cpu() && !device.is_cuda() && chosen != "fp32") {
      fail_or_warn(first, "autocast runs on CPU and CUDA devices, not " + device.str());
      chosen = "fp32";
    }
    if (device.is_cpu() && chosen == "fp16") {
      fail_or_warn(first,
                   "precision = \"fp16\" needs a CUDA device: CPU autocast computes in bfloat16 (use "
                   "\"bf16\" or \"auto\")");
      chosen = "fp32";
    }
    if (chosen == "bf16" && s_.precision == "bf16") {
      std::string native;
      if (!trainer::native_bf16(device, &native)) {
        logger_->warn(
            "mixed_precision: bf16 on {} is emulated ({}): expect it slower than fp32; "
            "precision = \"auto\" picks fp32 here",
            device.str(), native);
      }
    }
    for (const auto& p : ctx.model->parameters()) {
      if (chosen != "fp32" && p.scalar_type() != c10::kFloat) {
        logger_->warn(
            "mixed_precision: the model's parameters are {} (model.dtype), not float32: autocast only casts "
            "float32 inputs of matmuls and convolutions",
            c10::toString(p.scalar_type()));
        break;
      }
    }
    device_type_ = device.type();
    dtype_.reset();
    if (chosen == "bf16") dtype_ = c10::kBFloat16;
    if (chosen == "fp16") dtype_ = c10::kHalf;
    const bool scale = s_.grad_scaler == "on" || (s_.grad_scaler == "auto" && chosen == "fp16");
    if (scale && !scaler_) {
      scaler_.emplace(options_);
      if (saved_scale_) apply_saved();
    }
    if (!scale && scaler_) {
      // Kept for a later device that scales again: it continues from here, not from the start.
      saved_scale_ = scaler_->get_scale();
      saved_tracker_ = scaler_->growth_tracker();
      scaler_.reset();
    }
    logger_->info("mixed_precision: {} on {} ({}){}", chosen, device.str(), why,
                  scaler_ ? fmt::format(", GradScaler from scale {:g}", scaler_->get_scale()) : "");
  }

  void apply_saved() {
    scaler_->load(*saved_scale_, saved_tracker_);
    saved_scale_.reset();
  }

  /// An unusable setting: a usage error at the start, a warning (and fp32) after a device change.
  void fail_or_warn(bool first, const std::string& what) {
    if (first) throw trainer::UsageError("plugins.mixed_precision: " + what);
    logger_->warn("mixed_precision: {}; running fp32 from now on", what);
  }

  MixedPrecisionSettings s_;
  bool configured_ = false;
  trainer::GradScalerOptions options_;
  bool resolved_ = false;
  c10::DeviceType device_type_ = c10::kCPU;
  std::optional<c10::ScalarType> dtype_;  ///< autocast dtype; none = fp32
  std::optional<trainer::GradScaler> scaler_;
  std::optional<double> saved_scale_;
  std::int64_t saved_tracker_ = 0;
  std::int64_t skipped_ = 0;       ///< steps skipped for inf/NaN gradients this run (and before a resume)
  bool inf_this_attempt_ = false;  ///< the current attempt's gradients were not finite
  std::int64_t logged_step_ = -1;
};

}  // namespace

TRAINER_PLUGIN(MixedPrecisionPlugin)
