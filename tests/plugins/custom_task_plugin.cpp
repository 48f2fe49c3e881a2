// Test plugin: registers the task "hinge" (a multiclass hinge loss, the Crammer-Singer margin:
// max(0, 1 + the largest other logit - the target's logit)) when it is loaded, with its own
// key (task.margin) and metrics: eval/hinge_accuracy and eval/mean_margin, train/hinge_accuracy.
// The plugin itself reacts to no event: registering is all it does.
#include <ATen/ATen.h>

#include <limits>

#include "trainer/error.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"
#include "trainer/task.h"

namespace {

struct HingeSettings : trainer::Settings<HingeSettings> {
  double margin = 1.0;
  static void declare(trainer::SettingsSchema<HingeSettings>& s) {
    s.add(&HingeSettings::margin, "margin", "How far the target's logit must lead").min(0, false);
  }
};

class Hinge final : public trainer::Task {
 public:
  Hinge(double margin, std::int64_t classes) : margin_(margin), classes_(classes) {}
  std::int64_t outputs() const override { return classes_; }
  at::Tensor sample_losses(const at::Tensor& outputs, const at::Tensor& targets) const override {
    return at::relu(margin_ - lead(outputs.to(at::kFloat), targets));
  }
  std::int64_t train_width() const override { return 1; }
  at::Tensor train_sums(const at::Tensor& outputs, const at::Tensor& targets) const override {
    return outputs.argmax(1).eq(targets).sum().to(at::kDouble).reshape({1});
  }
  std::map<std::string, double> train_metrics(const at::Tensor& sums, std::int64_t samples) const override {
    return {{"hinge_accuracy", sums[0].item<double>() / double(samples)}};
  }
  std::int64_t eval_width() const override { return 3; }  // [loss, correct, the target's lead]
  at::Tensor eval_rows(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor x = outputs.to(at::kFloat);
    return at::stack({sample_losses(x, targets), x.argmax(1).eq(targets).to(at::kFloat), lead(x, targets)}, 1)
        .to(at::kDouble);
  }
  std::map<std::string, double> evaluate(const at::Tensor& rows) const override {
    return {{"hinge_accuracy", rows.select(1, 1).mean().item<double>()},
            {"mean_margin", rows.select(1, 2).mean().item<double>()}};
  }

 private:
  /// The target's logit minus the largest other logit.
  static at::Tensor lead(const at::Tensor& x, const at::Tensor& targets) {
    const at::Tensor t = targets.unsqueeze(1);
    const at::Tensor own = x.gather(1, t).squeeze(1);
    const at::Tensor others = x.scatter(1, t, -std::numeric_limits<float>::infinity()).amax(1);
    return own - others;
  }
  double margin_;
  std::int64_t classes_;
};

class CustomTaskPlugin final : public trainer::Plugin {
 public:
  CustomTaskPlugin() {
    trainer::task_registry().add(
        "hinge",
        [](const trainer::Config& section, const trainer::DataSpec& data,
           const trainer::Batch& probe) -> std::unique_ptr<trainer::Task> {
          TRAINER_CHECK_T(trainer::UsageError, probe.targets.scalar_type() == at::kLong,
                          "task.name = \"hinge\" needs integer class indices");
          return std::make_unique<Hinge>(HingeSettings::from(section).margin, data.num_classes);
        },
        HingeSettings::keys(), "Multiclass hinge loss (a test plugin's task)");
  }
  std::string name() const override { return "custom_task"; }
  std::vector<trainer::Event> events() const override { return {}; }
  void on_event(trainer::EventContext&, trainer::Control&) override {}
};

}  // namespace

TRAINER_PLUGIN(CustomTaskPlugin)
