// The task "regression": real-valued targets, MSE, L1 or Huber; MAE, RMSE and R² computed from
// per-sample rows.
#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "task/task_common.h"
#include "trainer/error.h"

namespace trainer::detail {

namespace {

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

std::unique_ptr<Task> regression_task(const Config& section, const Batch& probe) {
  const auto s = RegressionSettings::from(section);
  auto task = std::make_unique<Regression>(
      s, probe, scripted_loss(s.loss_path, {{"loss", s.loss != "mse"}, {"huber_delta", s.huber_delta != 1.0}}));
  if (!s.loss_path.empty()) try_scripted_loss(*task, probe, s.loss_path);
  return task;
}

std::vector<KeySpec> regression_task_keys() { return RegressionSettings::keys(); }

}  // namespace trainer::detail
