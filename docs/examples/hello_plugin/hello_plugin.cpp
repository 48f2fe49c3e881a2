// hello: greets at FitStart, counts optimizer steps, reports the best eval accuracy and
// asks the core to stop once it reaches `plugins.hello.stop_at_accuracy`.
#include <spdlog/spdlog.h>

#include <trainer/plugin.h>
#include <trainer/settings.h>

namespace {

/// [plugins.hello]: each key named once, its default in the member.
struct HelloSettings : trainer::Settings<HelloSettings> {
  std::string greeting = "hello from a plugin";
  double stop_at_accuracy = 0.0;

  static void declare(trainer::SettingsSchema<HelloSettings>& s) {
    s.add(&HelloSettings::greeting, "greeting", "Printed at FitStart");
    s.add(&HelloSettings::stop_at_accuracy, "stop_at_accuracy", "Stop when eval/accuracy reaches this; 0 = never")
        .min(0)
        .max(1);
  }
};

class HelloPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "hello"; }
  std::string version() const override { return "1.0.0"; }
  std::string description() const override { return "Example plugin: counts steps, stops at a target accuracy"; }

  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::FitStart, E::AfterOptimizerStep, E::EvalEnd, E::FitEnd};
  }

  std::vector<trainer::KeySpec> config_keys() const override { return HelloSettings::keys(); }

  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    settings_ = HelloSettings::from(section);
  }

  void on_event(trainer::EventContext& ctx, trainer::Control& control) override {
    switch (ctx.event) {
      case trainer::Event::FitStart:
        logger_->info("hello: {} ({} steps planned)", settings_.greeting, ctx.state.total_steps);
        break;
      case trainer::Event::AfterOptimizerStep:
        ++steps_;
        break;
      case trainer::Event::EvalEnd: {
        const double acc = ctx.eval_metrics->at("eval/accuracy");
        best_ = std::max(best_, acc);
        ctx.metrics->log(ctx.state.global_step, {{"hello/best_accuracy", best_}});
        if (settings_.stop_at_accuracy > 0 && acc >= settings_.stop_at_accuracy) {
          control.stop_training = true;
          control.reason = "target accuracy reached";  // the core adds the plugin's name
        }
        break;
      }
      case trainer::Event::FitEnd:
        logger_->info("hello: {} optimizer steps seen, best eval accuracy {:.4f}", steps_, best_);
        break;
      default:
        break;
    }
  }

 private:
  HelloSettings settings_;
  double best_ = 0.0;
  long steps_ = 0;
};

}  // namespace

TRAINER_PLUGIN(HelloPlugin)
