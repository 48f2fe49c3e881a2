// hello: greets at FitStart, counts optimizer steps, reports the best eval accuracy and
// asks the core to stop once it reaches `plugins.hello.stop_at_accuracy`.
#include <spdlog/spdlog.h>

#include <trainer/plugin.h>

namespace {

class HelloPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "hello"; }
  std::string version() const override { return "1.0.0"; }
  std::string description() const override { return "Example plugin: counts steps, stops at a target accuracy"; }

  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::FitStart, E::AfterOptimizerStep, E::EvalEnd, E::FitEnd};
  }

  std::vector<trainer::KeySpec> config_keys() const override {
    using T = trainer::ValueType;
    return {trainer::KeySpec("greeting", T::String, "Printed at FitStart").def(std::string("hello from a plugin")),
            trainer::KeySpec("stop_at_accuracy", T::Float, "Stop when eval/accuracy reaches this; 0 = never")
                .def(0.0)
                .min(0)
                .max(1)};
  }

  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    greeting_ = section.get<std::string>("greeting");
    target_ = section.get<double>("stop_at_accuracy");
  }

  void on_event(trainer::EventContext& ctx, trainer::Control& control) override {
    switch (ctx.event) {
      case trainer::Event::FitStart:
        logger_->info("hello: {} ({} steps planned)", greeting_, ctx.state.total_steps);
        break;
      case trainer::Event::AfterOptimizerStep:
        ++steps_;
        break;
      case trainer::Event::EvalEnd: {
        const double acc = ctx.eval_metrics->at("eval/accuracy");
        best_ = std::max(best_, acc);
        ctx.metrics->log(ctx.state.global_step, {{"hello/best_accuracy", best_}});
        if (target_ > 0 && acc >= target_) {
          control.stop_training = true;
          control.reason = "hello: target accuracy reached";
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
  std::string greeting_;
  double target_ = 0.0;
  double best_ = 0.0;
  long steps_ = 0;
};

}  // namespace

TRAINER_PLUGIN(HelloPlugin)
