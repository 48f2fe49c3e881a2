#include "train/train_metrics.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <string>

namespace trainer {

void TrainMetrics::log(const RunState& st) {
  if (steps_ == 0 && !skipped_in_window_) return;
  std::map<std::string, double> m;
  if (steps_ > 0) m = step_metrics(st);
  if (skipped_ > 0) {
    // Once a step was skipped, every log says so: a chart of them shows a run that keeps skipping.
    m["train/skipped_steps"] = double(skipped_);
    m["train/skipped_in_a_row"] = double(skipped_in_a_row_);
  }
  metrics_.log(st.global_step, m);
  grad_norm_ = 0;
  norms_ = 0;
  loss_ = 0;
  std::fill(stats_.begin(), stats_.end(), 0.0);
  steps_ = 0;
  samples_ = 0;
  excluded_s_ = 0.0;
  comm_s_ = 0.0;
  all_reduce_s_ = 0.0;
  skipped_in_window_ = false;
  start_ = Clock::now();
}

std::map<std::string, double> TrainMetrics::step_metrics(const RunState& st) const {
  const double secs = std::chrono::duration<double>(Clock::now() - start_).count() - excluded_s_;
  std::map<std::string, double> m{
      {"train/loss", loss_ / double(steps_)},
      {"train/lr", st.lr},
      {"train/epoch", double(st.epoch) + double(st.batch_in_epoch + 1) / double(st.steps_per_epoch)},
      {"train/samples_per_s", secs > 0 ? double(samples_) / secs : 0.0},
      {"train/micro_batch_size", double(micro_batch_)}};
  // The task's (train/accuracy for classification), of the batches as the model saw them while
  // training (dropout on, weights changing).
  if (task_ && !stats_.empty()) {
    const at::Tensor sums = at::tensor(stats_, at::kDouble);
    for (const auto& [name, value] : task_->train_metrics(sums, samples_)) m["train/" + name] = value;
  }
  // The window's mean, like train/loss: the total L2 norm of each step's gradient before clipping.
  if (norms_ > 0) m["train/grad_norm"] = grad_norm_ / double(norms_);
  if (comm_s_ > 0) {
    // Per step, and as a share of the window's training time: what data parallelism costs.
    m["dist/comm_s"] = comm_s_ / double(steps_);
    m["dist/comm_share"] = secs > 0 ? comm_s_ / secs : 0.0;
    m["dist/all_reduce_s"] = all_reduce_s_ / double(steps_);
    m["dist/all_reduce_share"] = secs > 0 ? all_reduce_s_ / secs : 0.0;
  }
  return m;
}

}  // namespace trainer
