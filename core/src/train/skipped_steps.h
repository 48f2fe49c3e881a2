#pragma once
// Private: the optimizer steps training.on_nonfinite = "skip_step" skipped, in the run and in a
// row, and when a run that keeps skipping has diverged (training.max_skipped_steps).
#include <cstdint>

namespace trainer {

class SkippedSteps {
 public:
  /// `max_in_a_row`: training.max_skipped_steps (0: no limit).
  explicit SkippedSteps(std::int64_t max_in_a_row) : max_(max_in_a_row) {}

  /// One more step skipped for a NaN or infinite loss or gradient.
  void skipped() {
    ++total_;
    ++in_a_row_;
    ++this_epoch_;
  }
  /// An optimizer step was taken: the row ends.
  void stepped() { in_a_row_ = 0; }

  /// Skipped in this process's run, and since the last step taken.
  std::int64_t total() const { return total_; }
  std::int64_t in_a_row() const { return in_a_row_; }

  /// More than training.max_skipped_steps in a row. While a row lasts the weights do not change,
  /// so every batch of it met the same weights: that many different batches all non-finite is
  /// the model's doing, not one bad batch's.
  bool diverged() const { return max_ > 0 && in_a_row_ > max_; }

  /// Whether the skip just counted is warned about on its own: each of the first 10, then each
  /// power of two (16, 32, 64, ...), so a run that keeps skipping says so without flooding its log.
  bool warn_each() const { return total_ <= 10 || (total_ & (total_ - 1)) == 0; }

  /// The skips since the last call (at an epoch's end: its summary line).
  std::int64_t take_epoch() {
    const std::int64_t n = this_epoch_;
    this_epoch_ = 0;
    return n;
  }

 private:
  std::int64_t max_;
  std::int64_t total_ = 0;
  std::int64_t in_a_row_ = 0;
  std::int64_t this_epoch_ = 0;
};

}  // namespace trainer
