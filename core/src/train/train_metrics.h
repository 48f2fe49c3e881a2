#pragma once
// Private: the training metrics of a window of optimizer steps (train/loss, the task's own such
// as train/accuracy, train/lr, train/epoch, train/samples_per_s, train/micro_batch_size,
// train/grad_norm when gradients are clipped, train/skipped_steps and train/skipped_in_a_row once
// a step was skipped for a NaN or infinity, and in a data-parallel run dist/comm_s,
// dist/comm_share, dist/all_reduce_s and dist/all_reduce_share), logged every
// training.log_every steps and at epoch ends.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/context.h"
#include "trainer/metrics.h"
#include "trainer/task.h"

namespace trainer {

class TrainMetrics {
 public:
  using Clock = std::chrono::steady_clock;

  /// `task`: whose training metrics the windows log (Task::train_metrics of their summed
  /// statistics); null: the loss only.
  TrainMetrics(MetricsLogger& metrics, std::shared_ptr<const Task> task) : metrics_(metrics), task_(std::move(task)) {}

  /// Starts the first window (when training starts).
  void start() { start_ = Clock::now(); }
  /// One optimizer step of `samples` samples with mean loss `loss`, the task's training
  /// statistics summed over them and, when the core clipped it, the gradient's norm before
  /// clipping.
  void add_step(double loss, std::int64_t samples, const std::vector<double>& stats, std::int64_t micro_batch,
                std::optional<double> grad_norm = std::nullopt) {
    loss_ += loss;
    ++steps_;
    samples_ += samples;
    if (stats_.size() < stats.size()) stats_.resize(stats.size(), 0.0);
    for (std::size_t i = 0; i < stats.size(); ++i) stats_[i] += stats[i];
    micro_batch_ = micro_batch;
    if (grad_norm) {
      grad_norm_ += *grad_norm;
      ++norms_;
    }
  }
  /// The optimizer steps skipped for a NaN or infinite loss or gradient (training.on_nonfinite =
  /// "skip_step"): `total` in the run so far, `in_a_row` since the last step taken; given at each
  /// skip and at each step after one. From the first skip on, each log has train/skipped_steps
  /// and train/skipped_in_a_row, also a window that took no step.
  void set_skipped(std::int64_t total, std::int64_t in_a_row) {
    skipped_ = total;
    skipped_in_a_row_ = in_a_row;
    skipped_in_window_ = true;
  }
  /// Seconds a data-parallel step spent in its collectives (agreements and the gradients'
  /// all-reduce, waiting for the slowest rank included).
  void add_comm(double seconds) { comm_s_ += seconds; }
  /// Of those, the seconds in the gradients' all-reduce itself (after the first agreement, so
  /// with the ranks already in step: transfer and summing, little waiting).
  void add_all_reduce(double seconds) { all_reduce_s_ += seconds; }
  /// Logs the window's metrics at `state.global_step` and starts a new window; nothing when
  /// the window has no step (but the skip counts when it skipped one).
  void log(const RunState& state);

  /// The step is over: what was logged at it (by the core and by plugins) goes to the sinks
  /// as one group.
  void commit() { metrics_.commit(); }

  /// Keeps the time until it dies out of samples/s: throughput is training only, without
  /// evaluations and checkpoints.
  class Pause {
   public:
    explicit Pause(TrainMetrics& m) : m_(m) {}
    ~Pause() { m_.excluded_s_ += std::chrono::duration<double>(Clock::now() - t0_).count(); }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    TrainMetrics& m_;
    Clock::time_point t0_ = Clock::now();
  };

 private:
  /// The window's metrics of its steps (it has at least one).
  std::map<std::string, double> step_metrics(const RunState& st) const;

  MetricsLogger& metrics_;
  double loss_ = 0.0;
  std::int64_t steps_ = 0, samples_ = 0;
  std::shared_ptr<const Task> task_;
  std::vector<double> stats_;     ///< the task's training statistics summed over the window
  std::int64_t micro_batch_ = 0;  ///< micro-batch size of the window's last step
  double grad_norm_ = 0.0;        ///< summed over the window's clipped steps
  std::int64_t norms_ = 0;
  Clock::time_point start_ = Clock::now();
  double excluded_s_ = 0.0;    ///< paused time inside the window
  double comm_s_ = 0.0;        ///< time in collectives inside the window (data-parallel runs)
  double all_reduce_s_ = 0.0;  ///< of which in the gradients' all-reduce
  std::int64_t skipped_ = 0;   ///< steps skipped for a NaN or infinity in the run (set_skipped)
  std::int64_t skipped_in_a_row_ = 0;
  bool skipped_in_window_ = false;  ///< a step was skipped since the last log
};

}  // namespace trainer
