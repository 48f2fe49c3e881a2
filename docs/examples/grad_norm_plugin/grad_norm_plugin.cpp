// grad_norm: logs the norm of the whole gradient before clipping, keeps its running mean
// (an exponential moving average) and counts spikes, and can skip the optimizer step of a
// batch whose gradient spikes. The average and the counts are plugin state: saved in every
// checkpoint and restored by --resume, so a resumed run does not start from zero.
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <trainer/plugin.h>
#include <trainer/settings.h>

#include <cmath>

namespace {

struct GradNormSettings : trainer::Settings<GradNormSettings> {
  double decay = 0.9;
  double spike_factor = 10.0;
  bool skip_spikes = false;

  static void declare(trainer::SettingsSchema<GradNormSettings>& s) {
    s.add(&GradNormSettings::decay, "decay", "Weight of the past in the running mean").min(0).max(1, false);
    s.add(&GradNormSettings::spike_factor, "spike_factor", "A norm this many times the mean is a spike").min(1);
    s.add(&GradNormSettings::skip_spikes, "skip_spikes", "Skip the optimizer step of a batch whose gradient spikes");
  }
};

class GradNormPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "grad_norm"; }
  std::string version() const override { return "1.0.0"; }
  std::string description() const override { return "Logs the unclipped gradient norm, its mean and spikes"; }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::Resume, E::GradientsAccumulated, E::AfterOptimizerStep, E::BatchEnd};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return GradNormSettings::keys(); }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = GradNormSettings::from(section);
  }

  // What a resume needs: the running mean and the counts.
  void save_state(trainer::PluginState& state) override {
    state.set_double("mean", mean_);
    state.set_int("steps", steps_);
    state.set_int("spikes", spikes_);
  }
  void load_state(const trainer::PluginState& state) override {
    mean_ = state.get_double("mean");
    steps_ = state.get_int("steps");
    spikes_ = state.get_int("spikes");
  }

  void on_event(trainer::EventContext& ctx, trainer::Control& control) override {
    switch (ctx.event) {
      case trainer::Event::Resume:
        logger_->info("grad_norm: restored mean {:.4g} over {} steps, {} spikes", mean_, steps_, spikes_);
        break;
      case trainer::Event::GradientsAccumulated: {
        // The batch's whole gradient (all micro-batches), before the core clips it.
        double sq = 0.0;
        for (const auto& p : ctx.model->parameters()) {
          if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
        }
        // Set, not added to: this event fires again when an out-of-memory retry re-runs the batch.
        norm_ = std::sqrt(sq);
        spike_ = steps_ > 0 && norm_ > s_.spike_factor * mean_;
        if (spike_) {
          if (s_.skip_spikes) {
            control.skip_step = true;
            control.reason = "gradient norm " + std::to_string(norm_) + " is a spike";
          }
        }
        break;
      }
      case trainer::Event::BatchEnd:  // once per batch, its step taken or skipped
        spikes_ += spike_ ? 1 : 0;
        spike_ = false;
        break;
      case trainer::Event::AfterOptimizerStep:
        mean_ = steps_ == 0 ? norm_ : s_.decay * mean_ + (1 - s_.decay) * norm_;
        ++steps_;
        ctx.metrics->log(ctx.state.global_step, {{"grad_norm/unclipped", norm_},
                                                 {"grad_norm/mean", mean_},
                                                 {"grad_norm/spikes", double(spikes_ + (spike_ ? 1 : 0))}});
        break;
      default:
        break;
    }
  }

 private:
  GradNormSettings s_;
  double norm_ = 0.0, mean_ = 0.0;
  bool spike_ = false;  ///< this batch's gradient spiked
  std::int64_t steps_ = 0, spikes_ = 0;
};

}  // namespace

TRAINER_PLUGIN(GradNormPlugin)
