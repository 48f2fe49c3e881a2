#include "train/train_metrics.h"

namespace trainer {

void TrainMetrics::log(const RunState& st) {
  if (steps_ == 0) return;
  const double secs = std::chrono::duration<double>(Clock::now() - start_).count() - excluded_s_;
  metrics_.log(st.global_step,
               {{"train/loss", loss_ / double(steps_)},
                {"train/lr", st.lr},
                {"train/epoch", double(st.epoch) + double(st.batch_in_epoch + 1) / double(st.steps_per_epoch)},
                {"train/samples_per_s", secs > 0 ? double(samples_) / secs : 0.0}});
  loss_ = 0;
  steps_ = 0;
  samples_ = 0;
  excluded_s_ = 0.0;
  start_ = Clock::now();
}

}  // namespace trainer
