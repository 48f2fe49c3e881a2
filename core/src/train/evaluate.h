#pragma once
// Private: evaluation on the test split (EvalStart … EvalEnd), retried from its first
// sample with a smaller eval batch after an out-of-memory error.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "trainer/context.h"
#include "trainer/core_settings.h"
#include "trainer/metrics.h"

namespace trainer {

class Hooks;
class OomRecovery;
class TrainMetrics;
struct RunParts;

class Evaluator {
 public:
  Evaluator(const EvalSettings& eval, RunParts& parts, const RunState& state, Hooks& hooks, OomRecovery& oom,
            MetricsLogger& metrics, TrainMetrics& window);

  /// Evaluates the model (eval mode, no grad) on the whole test split: the mean loss and the
  /// task's metrics, logged as eval/loss, eval/<metric> at the current step, then EvalEnd. The
  /// model is back in training mode afterwards, however it ends. Nothing when the run has no
  /// test split.
  std::map<std::string, double> run();

  /// The last evaluation's metrics (plugins' included) and the step it evaluated; step -1
  /// before the first.
  struct Last {
    std::int64_t step = -1;
    std::map<std::string, double> metrics;
  };
  const Last& last() const { return last_; }

  /// The model as it is now on the evaluation's samples: the task's metrics (unprefixed:
  /// "loss", "accuracy"). With `events`, EvalStart and the batch events fire and an
  /// out-of-memory error is retried with a smaller batch; without (evaluate_now()), neither.
  std::map<std::string, double> evaluate(bool events);

 private:
  RunParts& parts_;
  const RunState& state_;
  Hooks& hooks_;
  OomRecovery& oom_;
  MetricsLogger& metrics_;
  TrainMetrics& window_;
  std::int64_t limit_ = 0;  ///< samples evaluated (eval.limit_batches x eval.batch_size); 0 = all
  at::Tensor rows_;         ///< the task's row of each evaluated sample [samples, Task::eval_width()]
  Last last_;
};

}  // namespace trainer
