// The built-in tasks: classification (cross-entropy; accuracy, top-k, macro-F1), and the registry
// of all of them: multilabel (multilabel.cpp), regression (regression.cpp), masked_lm
// (masked_lm.cpp). Every metric is computed from per-sample rows, so it is exact whatever the
// evaluation batches, retries and ranks were.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "task/masked_lm.h"
#include "task/task_common.h"
#include "trainer/error.h"
#include "trainer/settings.h"
#include "trainer/task.h"

namespace trainer {

namespace {

using detail::f1;
using detail::kLossPathHelp;
using detail::mean_of;
using detail::refusal;
using detail::widened;

struct ClassificationSettings : Settings<ClassificationSettings> {
  double label_smoothing = 0.0;
  std::vector<double> class_weights;
  std::int64_t top_k = 5;
  std::string loss_path;

  static void declare(SettingsSchema<ClassificationSettings>& s) {
    s.add(&ClassificationSettings::label_smoothing, "label_smoothing",
          "Cross-entropy against targets smoothed toward uniform by this much")
        .min(0)
        .max(1, false);
    s.add(&ClassificationSettings::class_weights, "class_weights",
          "Weight of each class's samples in the loss (one per class; empty = 1 each); the batch loss is the mean "
          "over samples of the weighted losses")
        .min(0);
    s.add(&ClassificationSettings::top_k, "top_k",
          "Also log eval/top<k>_accuracy (the target among the k largest logits) when there are more than k "
          "classes; 0 = not")
        .min(0);
    s.add(&ClassificationSettings::loss_path, "loss_path",
          std::string(kLossPathHelp) + " (its targets: class indices, int64 [N])");
  }
};

class Classification final : public Task {
 public:
  Classification(const ClassificationSettings& s, const DataSpec& data, const Batch& probe, SampleLoss loss = {})
      : smoothing_(s.label_smoothing), classes_(data.num_classes), top_k_(s.top_k), loss_(std::move(loss)) {
    TRAINER_CHECK_T(UsageError, data.classes_refused.empty(), "task.name = \"classification\": ", data.classes_refused);
    TRAINER_CHECK_T(UsageError, at::isIntegralType(probe.targets.scalar_type(), /*includeBool=*/false),
                    refusal("classification", probe),
                    "; classification needs integer class indices (int64); for real-valued targets use "
                    "task.name = \"regression\", for 0/1 labels per class \"multilabel\"");
    TRAINER_CHECK_T(UsageError, probe.targets.dim() == 1, refusal("classification", probe),
                    "; classification needs one class index per sample ([N]); for several 0/1 labels per sample use "
                    "task.name = \"multilabel\"");
    TRAINER_CHECK_T(UsageError, classes_ >= 2, "task.name = \"classification\": the dataset declares ", classes_,
                    " classes; classification needs at least 2 (dataset.num_classes sets them for csv and npy data)");
    if (probe.targets.numel() > 0) {
      const auto lo = probe.targets.min().item<std::int64_t>(), hi = probe.targets.max().item<std::int64_t>();
      TRAINER_CHECK_T(UsageError, lo >= 0 && hi < classes_, refusal("classification", probe), " with values from ", lo,
                      " to ", hi, "; class indices must be in [0, ", classes_, ") (the dataset's ", classes_,
                      " classes)");
    }
    TRAINER_CHECK_T(UsageError, !loss_ || (s.class_weights.empty() && s.label_smoothing == 0.0),
                    "task.class_weights and task.label_smoothing shape the cross-entropy; this task has a loss of its "
                    "own, which they would not change: leave them out");
    if (!s.class_weights.empty()) {
      TRAINER_CHECK_T(UsageError, static_cast<std::int64_t>(s.class_weights.size()) == classes_,
                      "task.class_weights has ", s.class_weights.size(), " values; the dataset has ", classes_,
                      " classes: give one weight per class");
      weights_ = at::tensor(s.class_weights, at::kDouble);
    }
  }

  std::int64_t outputs() const override { return classes_; }

  at::Tensor sample_losses(const at::Tensor& outputs, const at::Tensor& targets) const override {
    if (loss_) return loss_(widened(outputs), targets.to(at::kLong));
    const at::Tensor x = widened(outputs);
    const at::Tensor w = weights_.defined() ? weights_.to(x.device(), x.scalar_type()) : at::Tensor();
    return at::cross_entropy_loss(x, targets.to(at::kLong), w, at::Reduction::None, -100, smoothing_);
  }

  /// Cross-entropy's own mean reduction (one kernel fewer in the step) where it is the mean over
  /// samples: without class weights, whose mean PyTorch divides by the weights' sum instead.
  at::Tensor mean_loss(const at::Tensor& outputs, const at::Tensor& targets) const override {
    if (loss_ || weights_.defined()) return sample_losses(outputs, targets).mean();
    return at::cross_entropy_loss(widened(outputs), targets.to(at::kLong), {}, at::Reduction::Mean, -100, smoothing_);
  }

  std::int64_t train_width() const override { return 1; }
  at::Tensor train_sums(const at::Tensor& outputs, const at::Tensor& targets) const override {
    return outputs.argmax(1).eq(targets).sum().reshape({1});  // an integer count: the step sums in double
  }
  std::map<std::string, double> train_metrics(const at::Tensor& sums, std::int64_t samples) const override {
    return {{"accuracy", samples > 0 ? sums[0].item<double>() / double(samples) : 0.0}};
  }

  /// [loss, predicted class, target, classes with a larger logit than the target's]
  std::int64_t eval_width() const override { return 4; }
  at::Tensor eval_rows(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor t = targets.to(at::kLong);
    // The test split's classes are the training split's: one beyond them has no logit.
    if (t.numel() > 0) {
      const auto lo = t.min().item<std::int64_t>(), hi = t.max().item<std::int64_t>();
      TRAINER_CHECK_T(UsageError, lo >= 0 && hi < classes_,
                      "task.name = \"classification\": an evaluated sample has "
                      "the class ",
                      lo < 0 ? lo : hi, "; the model has ", classes_,
                      " classes (those of the training "
                      "split; set dataset.num_classes when the training split lacks some)");
    }
    const at::Tensor above = outputs.gt(outputs.gather(1, t.unsqueeze(1))).sum(1);
    return at::stack({sample_losses(outputs, t).to(at::kDouble), outputs.argmax(1).to(at::kDouble), t.to(at::kDouble),
                      above.to(at::kDouble)},
                     1);
  }

  std::map<std::string, double> evaluate(const at::Tensor& rows) const override {
    const std::int64_t n = rows.size(0);
    const auto r = rows.accessor<double, 2>();
    std::vector<double> tp(classes_), fp(classes_), fn(classes_);
    double correct = 0, in_top_k = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto pred = static_cast<std::int64_t>(r[i][1]), target = static_cast<std::int64_t>(r[i][2]);
      if (pred == target) {
        ++correct;
        ++tp[target];
      } else {
        ++fp[pred];
        ++fn[target];
      }
      if (r[i][3] < double(top_k_)) ++in_top_k;
    }
    std::vector<double> f1s;
    for (std::int64_t c = 0; c < classes_; ++c) {
      if (const auto f = f1(tp[c], fp[c], fn[c])) f1s.push_back(*f);
    }
    std::map<std::string, double> m{{"accuracy", n > 0 ? correct / double(n) : 0.0}, {"macro_f1", mean_of(f1s)}};
    if (top_k_ > 0 && top_k_ < classes_) m[fmt::format("top{}_accuracy", top_k_)] = n > 0 ? in_top_k / double(n) : 0.0;
    return m;
  }

 private:
  double smoothing_;
  std::int64_t classes_;
  std::int64_t top_k_;
  at::Tensor weights_;  ///< [classes] double, or undefined
  SampleLoss loss_;     ///< a plugin's loss in place of cross-entropy, or empty
};

}  // namespace

Registry<TaskFactory>& task_registry() {
  static Registry<TaskFactory>* reg = [] {
    auto* r = new Registry<TaskFactory>("task");
    r->add(
        "classification",
        [](const Config& c, const DataSpec& d, const Batch& probe) { return classification_task(c, d, probe); },
        ClassificationSettings::keys(),
        "One class per sample: cross-entropy; accuracy, top-k accuracy, macro-F1 (integer targets [N])");
    r->add(
        "multilabel",
        [](const Config& c, const DataSpec&, const Batch& probe) { return detail::multilabel_task(c, probe); },
        detail::multilabel_task_keys(),
        "Several 0/1 labels per sample: binary cross-entropy on logits; micro- and macro-F1, mAP (targets [N, L])");
    r->add(
        "regression",
        [](const Config& c, const DataSpec&, const Batch& probe) { return detail::regression_task(c, probe); },
        detail::regression_task_keys(), "Real-valued targets: MSE, L1 or Huber; MAE, RMSE, R² (targets [N] or [N, T])");
    r->add(
        "masked_lm",
        [](const Config&, const DataSpec& d, const Batch& probe) { return detail::masked_lm_task(d, probe); }, {},
        "Masked language modelling (BERT's): cross-entropy of the hidden tokens, averaged over the batch's masked "
        "tokens; accuracy and perplexity (a text dataset with dataset.masked_lm = true)");
    return r;
  }();
  return *reg;
}

std::unique_ptr<Task> classification_task(const Config& section, const DataSpec& data, const Batch& probe,
                                          SampleLoss loss) {
  const auto s = ClassificationSettings::from(section);
  TRAINER_CHECK_T(UsageError, !loss || s.loss_path.empty(), "task.loss_path = \"", s.loss_path,
                  "\": this task has a loss of its own (its plugin's), which a scripted loss cannot replace; leave "
                  "task.loss_path out or use task.name = \"classification\"");
  if (loss) return std::make_unique<Classification>(s, data, probe, std::move(loss));
  auto task = std::make_unique<Classification>(
      s, data, probe,
      detail::scripted_loss(
          s.loss_path, {{"class_weights", !s.class_weights.empty()}, {"label_smoothing", s.label_smoothing != 0.0}}));
  if (!s.loss_path.empty()) detail::try_scripted_loss(*task, probe, s.loss_path);
  return task;
}

std::vector<KeySpec> classification_task_keys() { return ClassificationSettings::keys(); }

at::Tensor Task::mean_loss(const at::Tensor& outputs, const at::Tensor& targets) const {
  const at::Tensor losses = sample_losses(outputs, targets);
  const at::Tensor w = sample_weights(targets);
  if (!w.defined()) return losses.mean();
  const at::Tensor weights = w.to(losses.device(), losses.scalar_type());
  const at::Tensor total = weights.sum();
  // 0 (not 0/0) when the weights add up to 0: such a micro-batch adds nothing.
  return (losses * weights).sum() / at::where(total.gt(0), total, at::ones_like(total));
}

std::unique_ptr<Task> make_task(const Config& cfg, const Dataset& dataset, const DataSpec* spec) {
  const std::string name = cfg.get_or<std::string>("task.name", "classification");
  const auto factory = task_registry().get(name).factory;
  const std::int64_t n = std::min<std::int64_t>(dataset.size(), 8);
  TRAINER_CHECK_T(UsageError, n > 0, "the dataset has no sample to train on");
  const Batch probe = dataset.get(at::arange(n, at::kLong));
  TRAINER_CHECK_T(UsageError, probe.targets.defined() && probe.targets.size(0) == n, "the dataset gave ",
                  probe.targets.defined() ? probe.targets.size(0) : 0, " targets for ", n, " samples");
  return factory(cfg.sub("task"), spec ? *spec : dataset.spec(), probe);
}

}  // namespace trainer
