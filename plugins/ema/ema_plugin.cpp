// ema: an exponential moving average of the weights (timm's ModelEma, Composer's EMA), kept
// beside the weights the optimizer trains. After each optimizer step every trainable
// parameter and floating buffer is averaged, ema = decay' x ema + (1 - decay') x weight, with
// decay' = min(decay, (1 + n) / (10 + n)) after n updates when warm-up is on (TensorFlow's
// ExponentialMovingAverage with num_updates), else decay; integer buffers are copied. Each
// evaluation also evaluates the averaged weights on the same samples (eval/ema/loss,
// eval/ema/accuracy, …: checkpoint.monitor and early_stopping may use them); checkpoints hold
// the average (a resume goes on with it), and the end of the run writes ema_model.pt, the
// model with the averaged weights, which model.weights loads.
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>

#include <map>
#include <string>
#include <vector>

#include "trainer/distributed.h"
#include "trainer/error.h"
#include "trainer/evaluation.h"
#include "trainer/lora.h"
#include "trainer/plugin.h"
#include "trainer/plugin_state.h"
#include "trainer/settings.h"

namespace {

struct EmaSettings : trainer::Settings<EmaSettings> {
  double decay = 0.999;
  bool warmup = true;
  bool evaluate = true;
  bool save_model = true;

  static void declare(trainer::SettingsSchema<EmaSettings>& s) {
    s.add(&EmaSettings::decay, "decay",
          "Weight of the average at each update (timm: 0.9998; Composer's half-life h: 0.5^(1/h))")
        .min(0, false)
        .max(1, false);
    s.add(&EmaSettings::warmup, "warmup",
          "Use min(decay, (1 + n) / (10 + n)) after n updates: the average follows the weights closely at first");
    s.add(&EmaSettings::evaluate, "evaluate", "Also evaluate the averaged weights at each evaluation (eval/ema/*)");
    s.add(&EmaSettings::save_model, "save_model",
          "Write <run_dir>/ema_model.pt, the model with the averaged weights, when training ends");
  }
};

class EmaPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "ema"; }
  std::string description() const override {
    return "An exponential moving average of the weights, evaluated (eval/ema/*) and saved beside them";
  }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::OptimizerCreated, E::AfterOptimizerStep, E::EvalMetrics, E::FitEnd};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return EmaSettings::keys(); }
  // After the plugins that change the step (a GradScaler's skip is known at AfterOptimizerStep).
  int default_priority() const override { return 100; }
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = EmaSettings::from(section);
  }

  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    switch (ctx.event) {
      case trainer::Event::OptimizerCreated:
        start(*ctx.model);
        break;
      case trainer::Event::AfterOptimizerStep:
        update();
        break;
      case trainer::Event::EvalMetrics:
        if (s_.evaluate && ctx.eval_metrics) evaluate(*ctx.eval_metrics);
        break;
      case trainer::Event::FitEnd:
        if (s_.save_model && trainer::rank_of_this_process() == 0) save(ctx);
        break;
      default:
        break;
    }
  }

  void save_state(trainer::PluginState& state) override {
    state.set_int("updates", updates_);
    for (const auto& t : tracked_) state.set_tensor("ema/" + t.name, t.average);
  }

  /// A resume (after OptimizerCreated): the checkpoint's average, which must fit this model.
  void load_state(const trainer::PluginState& state) override {
    at::NoGradGuard no_grad;
    for (auto& t : tracked_) {
      const at::Tensor saved = state.get_tensor("ema/" + t.name);
      TRAINER_CHECK_T(trainer::UsageError, saved.defined(), "ema: the checkpoint's average has no '", t.name,
                      "' (a checkpoint of another model, or of a run that trained other parameters)");
      TRAINER_CHECK_T(trainer::UsageError, saved.sizes() == t.average.sizes(), "ema: the checkpoint's average of '",
                      t.name, "' has shape ", saved.sizes(), ", the model's is ", t.average.sizes());
      t.average.copy_(saved);
    }
    updates_ = state.get_int("updates", 0);
    logger_->info("ema: the average of {} tensors restored ({} updates)", tracked_.size(), updates_);
  }

 private:
  struct Tracked {
    std::string name;
    at::Tensor live;     ///< the model's tensor
    at::Tensor average;  ///< its average
    bool averaged;       ///< floating (averaged) or not (copied)
  };

  /// The average starts as the weights the run starts from (a resume then loads its own).
  void start(torch::nn::Module& model) {
    at::NoGradGuard no_grad;
    tracked_.clear();
    for (const auto& p : model.named_parameters()) {
      if (!p.value().requires_grad()) continue;  // frozen: its average is itself
      tracked_.push_back({p.key(), p.value(), p.value().detach().clone(), true});
    }
    for (const auto& b : model.named_buffers()) {
      tracked_.push_back({b.key(), b.value(), b.value().detach().clone(), b.value().is_floating_point()});
    }
    updates_ = 0;
    logger_->info("ema: averaging {} tensors, decay {}{}", tracked_.size(), s_.decay,
                  s_.warmup ? " (with warm-up)" : "");
  }

  void update() {
    at::NoGradGuard no_grad;
    ++updates_;
    const double d = s_.warmup ? std::min(s_.decay, (1.0 + double(updates_)) / (10.0 + double(updates_))) : s_.decay;
    for (auto& t : tracked_) {
      if (t.averaged) {
        t.average.lerp_(t.live.to(t.average.dtype()), 1.0 - d);
      } else {
        t.average.copy_(t.live);
      }
    }
  }

  /// The model's tensors and the average exchange their data (a swap twice puts them back).
  /// Nothing is allocated or copied, so nothing can fail half-way: the parameters stay the
  /// same objects (the optimizer's), with the other storage.
  void swap() {
    for (auto& t : tracked_) {
      at::Tensor live = t.live.data();
      t.live.set_data(t.average);
      t.average = live;
    }
  }

  /// The averaged weights in the model for the scope's lifetime.
  struct Swapped {
    explicit Swapped(EmaPlugin& p) : plugin(p) { plugin.swap(); }
    ~Swapped() { plugin.swap(); }
    EmaPlugin& plugin;
  };

  void evaluate(std::map<std::string, double>& metrics) {
    std::map<std::string, double> ema;
    {
      Swapped averaged(*this);
      ema = trainer::evaluate_now();
    }
    for (const auto& [name, value] : ema) metrics["eval/ema/" + name] = value;
  }

  void save(trainer::EventContext& ctx) {
    if (!ctx.model) return;
    const std::string file = ctx.run_dir + "/ema_model.pt";
    std::int64_t n = 0;
    {
      Swapped averaged(*this);
      n = trainer::save_merged_model(*ctx.model, file);
    }
    logger_->info("ema: the model with the averaged weights ({} tensors, {} updates) written to {}", n, updates_, file);
  }

  EmaSettings s_;
  std::vector<Tracked> tracked_;
  std::int64_t updates_ = 0;
};

}  // namespace

TRAINER_PLUGIN(EmaPlugin)
