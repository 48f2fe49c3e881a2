#pragma once
// The loader that reads training batches ahead of the step (the core's loop uses it; a
// benchmark or a loop of your own may too). Worker threads call
// Dataset::get_in_epoch for the batches of the epoch's plan, in plan order, at most `prefetch`
// batches ahead of the one the step takes; the step takes them in plan order. A batch depends
// only on its indices and the epoch, so the batches are the same whatever the number of
// workers (0: each batch is read when the step asks, on its thread).
#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "trainer/data.h"
#include "trainer/export.h"

namespace trainer {

namespace detail {
struct Refusal;
}

class TRAINER_API BatchLoader {
 public:
  BatchLoader(std::shared_ptr<Dataset> dataset, std::int64_t workers, std::int64_t prefetch);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  /// The batches of `epoch` the step will ask for, in order (index tensors). Drops what is
  /// left of the previous plan, read or not.
  void plan(std::int64_t epoch, std::vector<at::Tensor> batches);

  /// The batch at `indices` as trained on in the planned epoch: the next planned one (read
  /// ahead; waits when not read yet; planned batches before it are dropped, as when the step
  /// skips one), the one last returned again (a retried step), or, for anything else, read
  /// now. A worker's error (out of memory, a file that cannot be
  /// read) is thrown here, to the step that asked for that batch.
  Batch next(const at::Tensor& indices);

  /// Forgets the batch last returned (kept for a retry of its step), freeing its memory once
  /// the step is done with it.
  void release();

  /// Batches the step waited for / batches read ahead and ready when asked (since creation).
  std::int64_t waited() const { return waited_; }
  std::int64_t ready() const { return ready_; }

 private:
  struct Job {
    at::Tensor indices;
    Batch batch;
    std::exception_ptr error;
    std::shared_ptr<const detail::Refusal> refused;  ///< what was live when the worker's allocation was refused
    bool done = false;
  };
  void work();

  std::shared_ptr<Dataset> dataset_;
  std::int64_t prefetch_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Job> jobs_;
  std::int64_t epoch_ = 0;
  std::uint64_t generation_ = 0;  ///< bumped by plan(): work of an older plan is dropped
  std::size_t issue_ = 0;         ///< next job a worker takes
  std::size_t take_ = 0;          ///< next job the step takes
  bool stop_ = false;
  at::Tensor last_indices_;
  Batch last_;
  std::int64_t waited_ = 0, ready_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace trainer
