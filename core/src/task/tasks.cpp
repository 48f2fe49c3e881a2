// The built-in tasks: classification (cross-entropy; accuracy, top-k, macro-F1), multilabel
// (binary cross-entropy on logits; micro/macro-F1, mAP) and regression (MSE, L1 or Huber; MAE,
// RMSE, R²). Every metric is computed from per-sample rows, so it is exact whatever the
// evaluation batches, retries and ranks were.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "model/torchscript.h"
#include "task/masked_lm.h"
#include "trainer/error.h"
#include "trainer/settings.h"
#include "trainer/task.h"

namespace trainer {

namespace {

/// Losses are computed in float32 at least: a bfloat16/half output (autocast) is widened first,
/// a float64 model keeps float64.
at::Tensor widened(const at::Tensor& outputs) {
  return outputs.scalar_type() == at::kDouble ? outputs : outputs.to(at::kFloat);
}

std::string dtype_name(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

std::string shape_text(at::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

/// What a task's refusal of the data starts with.
std::string refusal(const std::string& task, const Batch& probe) {
  return fmt::format("task.name = \"{}\": the dataset's targets are {} of shape {} (per batch)", task,
                     dtype_name(probe.targets), shape_text(probe.targets.sizes()));
}

double mean_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

/// F1 of one class or label from its counts; nullopt when it has neither targets nor
/// predictions (a class then is left out of a macro average, as scikit-learn leaves out a
/// class absent from targets and predictions; a label scores 0).
std::optional<double> f1(double tp, double fp, double fn) {
  const double d = 2.0 * tp + fp + fn;
  if (d == 0.0) return std::nullopt;
  return 2.0 * tp / d;
}

constexpr const char* kLossPathHelp =
    "A loss scripted in Python (torch.jit.script(loss).save(path)) in place of the task's own: forward(outputs, "
    "targets) returns each sample's loss [N]; the task's checks of the data and its metrics stay";

/// The loss scripted in `path` (none when empty). `own` names the task's keys that shape its own
/// loss and whether each is away from its default: such a key is refused beside it (it would
/// change nothing). Values, not where they came from, decide: a run's config.toml repeats every
/// default.
SampleLoss scripted_loss(const std::string& path, const std::vector<std::pair<const char*, bool>>& own) {
  if (path.empty()) return {};
  for (const auto& [key, set] : own) {
    TRAINER_CHECK_T(UsageError, !set, "task.", key, " shapes the task's own loss, which task.loss_path = \"", path,
                    "\" replaces: leave task.", key, " at its default");
  }
  return load_torchscript_loss("task.loss_path", path);
}

/// The first call of a scripted loss, at setup rather than at the first step: float32 outputs of
/// zeros [n, outputs] with a gradient (computed from a leaf, as a model's are) against the
/// probe's targets, as the task passes them on. The run's device, dtype and evaluation (no
/// gradient) are met at the first step.
void try_scripted_loss(const Task& task, const Batch& probe, const std::string& path) {
  const at::Tensor outputs = at::zeros({probe.targets.size(0), task.outputs()}).requires_grad_().mul(1);
  try {
    (void)task.sample_losses(outputs, probe.targets);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  } catch (const c10::Error& e) {
    throw UsageError(fmt::format("task.loss_path = \"{}\": the loss failed on the dataset's first samples: {}", path,
                                 e.what_without_backtrace()));
  }
}

// ---------------------------------------------------------------------------------------------
// classification

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

// ---------------------------------------------------------------------------------------------
// multilabel

struct MultilabelSettings : Settings<MultilabelSettings> {
  double threshold = 0.5;
  std::vector<double> pos_weight;
  std::string loss_path;

  static void declare(SettingsSchema<MultilabelSettings>& s) {
    s.add(&MultilabelSettings::threshold, "threshold",
          "A label is predicted when the sigmoid of its logit exceeds this (for the F1 scores)")
        .min(0, false)
        .max(1, false);
    s.add(&MultilabelSettings::pos_weight, "pos_weight",
          "Weight of each label's positive samples in the loss (one per label; empty = 1 each)")
        .min(0);
    s.add(&MultilabelSettings::loss_path, "loss_path",
          std::string(kLossPathHelp) + " (its targets: 0/1 labels as the outputs' floats [N, labels])");
  }
};

/// Average precision of one label: the area under its precision-recall curve as a step
/// function over the distinct scores, largest first (scikit-learn's average_precision_score).
/// nullopt when the label has no positive sample.
std::optional<double> average_precision(std::vector<std::pair<double, double>> scored /* (score, target) */) {
  const double positives =
      std::accumulate(scored.begin(), scored.end(), 0.0, [](double a, const auto& p) { return a + p.second; });
  if (positives == 0) return std::nullopt;
  // A NaN score (a diverged model) ranks last: the order is then a strict weak ordering.
  for (auto& s : scored) {
    if (std::isnan(s.first)) s.first = -std::numeric_limits<double>::infinity();
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  double tp = 0, fp = 0, recall_before = 0, ap = 0;
  for (std::size_t i = 0; i < scored.size(); ++i) {
    tp += scored[i].second;
    fp += 1.0 - scored[i].second;
    if (i + 1 < scored.size() && scored[i + 1].first == scored[i].first) continue;  // one threshold per score
    const double recall = tp / positives;
    ap += (recall - recall_before) * tp / (tp + fp);
    recall_before = recall;
  }
  return ap;
}

class Multilabel final : public Task {
 public:
  Multilabel(const MultilabelSettings& s, const Batch& probe, SampleLoss loss)
      : threshold_(s.threshold), loss_(std::move(loss)) {
    TRAINER_CHECK_T(UsageError, probe.targets.dim() == 2 && probe.targets.size(1) >= 1, refusal("multilabel", probe),
                    "; multilabel needs a row of 0/1 labels per sample ([N, labels]); for one class index per sample "
                    "use task.name = \"classification\"");
    labels_ = probe.targets.size(1);
    const at::Tensor t = probe.targets.to(at::kDouble);
    TRAINER_CHECK_T(UsageError, t.eq(0).logical_or(t.eq(1)).all().item<bool>(), refusal("multilabel", probe),
                    " with values other than 0 and 1; multilabel targets are 0 (absent) or 1 (present); for "
                    "real-valued targets use task.name = \"regression\"");
    if (!s.pos_weight.empty()) {
      TRAINER_CHECK_T(UsageError, static_cast<std::int64_t>(s.pos_weight.size()) == labels_, "task.pos_weight has ",
                      s.pos_weight.size(), " values; the dataset has ", labels_, " labels: give one per label");
      pos_weight_ = at::tensor(s.pos_weight, at::kDouble);
    }
    logit_threshold_ = std::log(threshold_ / (1.0 - threshold_));
  }

  std::int64_t outputs() const override { return labels_; }

  at::Tensor sample_losses(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor x = widened(outputs);
    if (loss_) return loss_(x, targets.to(x.scalar_type()));
    const at::Tensor pw = pos_weight_.defined() ? pos_weight_.to(x.device(), x.scalar_type()) : at::Tensor();
    return at::binary_cross_entropy_with_logits(x, targets.to(x.scalar_type()), {}, pw, at::Reduction::None).mean(1);
  }

  /// [true positives, false positives, false negatives] over labels and samples
  std::int64_t train_width() const override { return 3; }
  at::Tensor train_sums(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor pred = outputs.to(at::kDouble).gt(logit_threshold_);
    const at::Tensor t = targets.to(at::kDouble).gt(0.5);
    return at::stack({pred.logical_and(t).sum(), pred.logical_and(t.logical_not()).sum(),
                      pred.logical_not().logical_and(t).sum()})
        .to(at::kDouble);
  }
  std::map<std::string, double> train_metrics(const at::Tensor& sums, std::int64_t) const override {
    const auto f = f1(sums[0].item<double>(), sums[1].item<double>(), sums[2].item<double>());
    return {{"micro_f1", f.value_or(0.0)}};
  }

  /// [loss, logits (labels), targets (labels)]
  std::int64_t eval_width() const override { return 1 + 2 * labels_; }
  at::Tensor eval_rows(const at::Tensor& outputs, const at::Tensor& targets) const override {
    return at::cat({sample_losses(outputs, targets).to(at::kDouble).unsqueeze(1), outputs.to(at::kDouble),
                    targets.to(at::kDouble)},
                   1);
  }

  std::map<std::string, double> evaluate(const at::Tensor& rows) const override {
    const std::int64_t n = rows.size(0);
    const auto r = rows.accessor<double, 2>();
    double tp_all = 0, fp_all = 0, fn_all = 0;
    std::vector<double> f1s, aps;
    std::vector<std::pair<double, double>> scored(static_cast<std::size_t>(n));
    for (std::int64_t l = 0; l < labels_; ++l) {
      double tp = 0, fp = 0, fn = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double logit = r[i][1 + l], target = r[i][1 + labels_ + l];
        const bool pred = logit > logit_threshold_;
        tp += pred && target > 0.5;
        fp += pred && target < 0.5;
        fn += !pred && target > 0.5;
        scored[static_cast<std::size_t>(i)] = {logit, target};
      }
      tp_all += tp;
      fp_all += fp;
      fn_all += fn;
      // A label with neither targets nor predictions scores 0, as in scikit-learn's
      // f1_score(average="macro") of indicator targets (zero_division = 0).
      f1s.push_back(f1(tp, fp, fn).value_or(0.0));
      if (const auto ap = average_precision(scored)) aps.push_back(*ap);
    }
    return {{"micro_f1", f1(tp_all, fp_all, fn_all).value_or(0.0)}, {"macro_f1", mean_of(f1s)}, {"map", mean_of(aps)}};
  }

 private:
  double threshold_;
  double logit_threshold_ = 0.0;  ///< the threshold as a logit: sigmoid(x) > t  <=>  x > log(t / (1 - t))
  std::int64_t labels_ = 0;
  at::Tensor pos_weight_;  ///< [labels] double, or undefined
  SampleLoss loss_;        ///< task.loss_path's loss in place of binary cross-entropy, or empty
};

// ---------------------------------------------------------------------------------------------
// regression

struct RegressionSettings : Settings<RegressionSettings> {
  std::string loss = "mse";
  double huber_delta = 1.0;
  std::string loss_path;

  static void declare(SettingsSchema<RegressionSettings>& s) {
    s.add(&RegressionSettings::loss, "loss", "mse (squared error), l1 (absolute error) or huber")
        .choices({"mse", "l1", "huber"});
    s.add(&RegressionSettings::huber_delta, "huber_delta", "Where the Huber loss turns from squared to linear")
        .min(0, false);
    s.add(&RegressionSettings::loss_path, "loss_path",
          std::string(kLossPathHelp) + " (its targets: the outputs' floats and shape [N, targets])");
  }
};

class Regression final : public Task {
 public:
  Regression(const RegressionSettings& s, const Batch& probe, SampleLoss scripted)
      : loss_(s.loss), delta_(s.huber_delta), scripted_(std::move(scripted)) {
    const auto type = probe.targets.scalar_type();
    TRAINER_CHECK_T(UsageError, type != at::kBool && (at::isFloatingType(type) || at::isIntegralType(type, false)),
                    refusal("regression", probe), "; regression needs numbers");
    TRAINER_CHECK_T(UsageError, probe.targets.dim() == 1 || probe.targets.dim() == 2, refusal("regression", probe),
                    "; regression needs one target per sample ([N]) or a row of them ([N, targets])");
    targets_ = probe.targets.dim() == 1 ? 1 : probe.targets.size(1);
  }

  std::int64_t outputs() const override { return targets_; }

  at::Tensor sample_losses(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor x = widened(outputs);
    const at::Tensor y = targets.to(x.scalar_type()).reshape(x.sizes());
    if (scripted_) return scripted_(x, y);
    at::Tensor e;
    if (loss_ == "mse") {
      e = at::mse_loss(x, y, at::Reduction::None);
    } else if (loss_ == "l1") {
      e = at::l1_loss(x, y, at::Reduction::None);
    } else {
      e = at::huber_loss(x, y, at::Reduction::None, delta_);
    }
    return e.mean(1);
  }

  /// [absolute errors summed over samples and targets, squared errors of each target summed over samples]
  std::int64_t train_width() const override { return 1 + targets_; }
  at::Tensor train_sums(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor e = outputs.to(at::kDouble) - targets.to(at::kDouble).reshape(outputs.sizes());
    return at::cat({e.abs().sum().reshape({1}), e.square().sum(0)});
  }
  std::map<std::string, double> train_metrics(const at::Tensor& sums, std::int64_t samples) const override {
    if (samples == 0) return {};
    double rmse = 0;
    for (std::int64_t j = 0; j < targets_; ++j) rmse += std::sqrt(sums[1 + j].item<double>() / double(samples));
    return {{"mae", sums[0].item<double>() / (double(samples) * double(targets_))}, {"rmse", rmse / double(targets_)}};
  }

  /// [loss, absolute errors (targets), squared errors (targets), targets (targets)]
  std::int64_t eval_width() const override { return 1 + 3 * targets_; }
  at::Tensor eval_rows(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor y = targets.to(at::kDouble).reshape(outputs.sizes());
    const at::Tensor e = outputs.to(at::kDouble) - y;
    return at::cat({sample_losses(outputs, targets).to(at::kDouble).unsqueeze(1), e.abs(), e.square(), y}, 1);
  }

  std::map<std::string, double> evaluate(const at::Tensor& rows) const override {
    const std::int64_t n = rows.size(0), t = targets_;
    if (n == 0) return {};
    const auto r = rows.accessor<double, 2>();
    double abs_sum = 0;
    std::vector<double> r2s, rmses;
    for (std::int64_t j = 0; j < t; ++j) {
      double sse = 0, mean = 0, sst = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        abs_sum += r[i][1 + j];
        sse += r[i][1 + t + j];
        mean += r[i][1 + 2 * t + j];
      }
      mean /= double(n);
      for (std::int64_t i = 0; i < n; ++i) sst += (r[i][1 + 2 * t + j] - mean) * (r[i][1 + 2 * t + j] - mean);
      rmses.push_back(std::sqrt(sse / double(n)));
      // A constant target: 1 when predicted exactly, else 0 (scikit-learn's r2_score).
      r2s.push_back(sst > 0 ? 1.0 - sse / sst : (sse == 0 ? 1.0 : 0.0));
    }
    const double values = double(n) * double(t);
    // RMSE and R² of each target, averaged over the targets (scikit-learn's uniform_average).
    return {{"mae", abs_sum / values}, {"rmse", mean_of(rmses)}, {"r2", mean_of(r2s)}};
  }

 private:
  std::string loss_;
  double delta_;
  SampleLoss scripted_;  ///< task.loss_path's loss in place of loss_, or empty
  std::int64_t targets_ = 1;
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
        [](const Config& c, const DataSpec&, const Batch& probe) -> std::unique_ptr<Task> {
          const auto s = MultilabelSettings::from(c);
          auto task = std::make_unique<Multilabel>(s, probe,
                                                   scripted_loss(s.loss_path, {{"pos_weight", !s.pos_weight.empty()}}));
          if (!s.loss_path.empty()) try_scripted_loss(*task, probe, s.loss_path);
          return task;
        },
        MultilabelSettings::keys(),
        "Several 0/1 labels per sample: binary cross-entropy on logits; micro- and macro-F1, mAP (targets [N, L])");
    r->add(
        "regression",
        [](const Config& c, const DataSpec&, const Batch& probe) -> std::unique_ptr<Task> {
          const auto s = RegressionSettings::from(c);
          auto task = std::make_unique<Regression>(
              s, probe, scripted_loss(s.loss_path, {{"loss", s.loss != "mse"}, {"huber_delta", s.huber_delta != 1.0}}));
          if (!s.loss_path.empty()) try_scripted_loss(*task, probe, s.loss_path);
          return task;
        },
        RegressionSettings::keys(), "Real-valued targets: MSE, L1 or Huber; MAE, RMSE, R² (targets [N] or [N, T])");
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
      scripted_loss(s.loss_path,
                    {{"class_weights", !s.class_weights.empty()}, {"label_smoothing", s.label_smoothing != 0.0}}));
  if (!s.loss_path.empty()) try_scripted_loss(*task, probe, s.loss_path);
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
