#include "train/evaluate.h"

#include <ATen/ATen.h>

#include "train/hooks.h"
#include "train/oom_recovery.h"
#include "train/setup.h"
#include "train/train_metrics.h"

namespace trainer {

namespace {

/// The model in eval mode for the guard's lifetime.
struct EvalMode {
  explicit EvalMode(Model& m) : model(m) { model.eval(); }
  ~EvalMode() { model.train(); }
  Model& model;
};

}  // namespace

std::map<std::string, double> Evaluator::run() {
  std::map<std::string, double> m;
  if (!parts_.test_set) return m;
  TrainMetrics::Pause pause(window_);
  hooks_.fire(Event::EvalStart);
  const std::int64_t n = parts_.test_set->size();
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  {
    EvalMode eval_mode(*parts_.model);
    const auto settled = oom_.retry(OomRetry::AskPlugins, batch_, n, [&](std::int64_t batch) {
      // Every attempt starts from zero: a retried evaluation counts each sample once.
      loss_sum = 0.0;
      correct = 0;
      oom_.enter("eval");
      at::NoGradGuard no_grad;
      for (std::int64_t begin = 0, len = 0; begin < n; begin += len) {  // += len: no begin + batch to overflow
        len = std::min(batch, n - begin);
        const Batch b = parts_.test_set->get(at::arange(begin, begin + len, at::kLong));
        const at::Tensor x = b.inputs.to(parts_.device, parts_.input_dtype), y = b.targets.to(parts_.device);
        const at::Tensor out = parts_.model->forward(x);
        loss_sum += at::cross_entropy_loss(out, y, {}, at::Reduction::Sum).item<double>();
        correct += out.argmax(1).eq(y).sum().item<std::int64_t>();
      }
    });
    if (settled) batch_ = *settled;  // later evaluations keep the size that worked
  }
  m["eval/loss"] = loss_sum / double(n);
  m["eval/accuracy"] = double(correct) / double(n);
  metrics_.log(state_.global_step, m);
  hooks_.fire(Event::EvalEnd, EventArgs::evaluated(m));
  return m;
}

}  // namespace trainer
