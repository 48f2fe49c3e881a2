// The task "multilabel": several 0/1 labels per sample, binary cross-entropy on logits; micro-
// and macro-F1 and mean average precision, computed from per-sample rows.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "task/task_common.h"
#include "trainer/error.h"

namespace trainer::detail {

namespace {

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

}  // namespace

std::unique_ptr<Task> multilabel_task(const Config& section, const Batch& probe) {
  const auto s = MultilabelSettings::from(section);
  auto task =
      std::make_unique<Multilabel>(s, probe, scripted_loss(s.loss_path, {{"pos_weight", !s.pos_weight.empty()}}));
  if (!s.loss_path.empty()) try_scripted_loss(*task, probe, s.loss_path);
  return task;
}

std::vector<KeySpec> multilabel_task_keys() { return MultilabelSettings::keys(); }

}  // namespace trainer::detail
