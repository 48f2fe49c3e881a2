#include "trainer/loader.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "memory/backend.h"
#include "trainer/memory.h"

namespace trainer {

BatchLoader::BatchLoader(std::shared_ptr<Dataset> dataset, std::int64_t workers, std::int64_t prefetch)
    : dataset_(std::move(dataset)), prefetch_(std::max(prefetch, workers)) {
  for (std::int64_t i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  for (auto& t : threads_) t.join();
}

void BatchLoader::plan(std::int64_t epoch, std::vector<at::Tensor> batches) {
  last_indices_ = at::Tensor();  // a retry never crosses into another epoch
  last_ = Batch{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++generation_;
    epoch_ = epoch;
    jobs_.clear();
    jobs_.resize(batches.size());
    for (std::size_t i = 0; i < batches.size(); ++i) jobs_[i].indices = std::move(batches[i]);
    issue_ = take_ = 0;
  }
  changed_.notify_all();
}

void BatchLoader::work() {
  at::NoGradGuard no_grad;
  MemoryCategoryScope batches(MemoryCategory::Batch);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(
        lock, [&] { return stop_ || (issue_ < jobs_.size() && issue_ < take_ + static_cast<std::size_t>(prefetch_)); });
    if (stop_) return;
    const std::size_t i = issue_++;
    const std::uint64_t generation = generation_;
    const std::int64_t epoch = epoch_;
    const at::Tensor indices = jobs_[i].indices;
    lock.unlock();
    Batch batch;
    std::exception_ptr error;
    detail::RefusalPtr refused;
    detail::cpu_take_refusal();  // one the dataset caught itself before is not this read's
    try {
      batch = dataset_->get_in_epoch(indices, epoch);
    } catch (const std::exception& e) {
      error = std::current_exception();
      // A refused allocation goes with its error to the thread that recovers from it.
      if (is_out_of_memory(e)) refused = detail::cpu_take_refusal();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (generation != generation_ || i < take_) continue;  // a new plan came, or the step went past it
    jobs_[i].batch = std::move(batch);
    jobs_[i].error = error;
    jobs_[i].refused = std::move(refused);
    jobs_[i].done = true;
    changed_.notify_all();
  }
}

Batch BatchLoader::next(const at::Tensor& indices) {
  if (last_indices_.defined() && last_indices_.sizes() == indices.sizes() && at::equal(last_indices_, indices)) {
    return last_;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  // The next planned batch, or a later one when the step skipped some (a plugin's skip at
  // BatchStart): those are dropped.
  const auto same = [&](const at::Tensor& t) { return t.sizes() == indices.sizes() && at::equal(t, indices); };
  std::size_t found = jobs_.size();
  if (!threads_.empty()) {
    for (std::size_t j = take_; j < jobs_.size(); ++j) {
      if (same(jobs_[j].indices)) {
        found = j;
        break;
      }
    }
  }
  const bool planned = found < jobs_.size();
  if (planned && found > take_) {
    for (; take_ < found; ++take_) jobs_[take_] = Job{};  // a worker still reading one drops it (its slot is reset)
    // The window moved past what may not have been handed out yet: nothing before the batch
    // asked for is read any more, and the workers, idle when the window was full, wake up.
    issue_ = std::max(issue_, take_);
    changed_.notify_all();
  }
  Batch batch;
  if (planned) {
    Job& job = jobs_[take_];
    (job.done ? ready_ : waited_) += 1;
    changed_.wait(lock, [&] { return job.done; });
    std::exception_ptr error = job.error;
    detail::RefusalPtr refused = std::move(job.refused);
    batch = std::move(job.batch);
    job = Job{};
    ++take_;
    lock.unlock();
    changed_.notify_all();  // room for the workers to read further ahead
    if (refused) detail::cpu_keep_refusal(std::move(refused));
    if (error) std::rethrow_exception(error);
  } else {
    const std::int64_t epoch = epoch_;
    lock.unlock();
    batch = dataset_->get_in_epoch(indices, epoch);
  }
  last_indices_ = indices;
  last_ = batch;
  return batch;
}

void BatchLoader::release() {
  last_indices_ = at::Tensor();
  last_ = Batch{};
}

}  // namespace trainer
