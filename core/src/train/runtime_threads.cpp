#include "train/runtime_threads.h"

#include <ATen/Parallel.h>
#include <sched.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace trainer {

namespace {

/// The CPUs this process may run on (taskset, a batch system's cpuset); empty when unknown.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) out.push_back(i);
  }
  return out;
}

/// CPU seconds this process has used, all its threads together.
double process_cpu_seconds() {
  timespec t{};
  if (::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) != 0) return 0.0;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

/// The CPUs' times (of the CPUs in `cpus`) from /proc/stat and this process's CPU time now.
std::optional<RuntimeThreads::Sample> sample_proc_stat(const std::vector<int>& cpus) {
  std::ifstream f("/proc/stat");
  if (!f.is_open()) return std::nullopt;
  std::ostringstream text;
  text << f.rdbuf();
  const auto times = detail::parse_proc_stat(text.str(), cpus);
  if (!times) return std::nullopt;
  return RuntimeThreads::Sample{*times, process_cpu_seconds(), std::chrono::steady_clock::now()};
}

int core_count(const std::vector<int>& cpus) {
  return cpus.empty() ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                      : static_cast<int>(cpus.size());
}

}  // namespace

RuntimeThreads::RuntimeThreads(std::int64_t configured, int local_ranks, spdlog::logger& log)
    : RuntimeThreads(configured, local_ranks, log, core_count(allowed_cpus()),
                     [cpus = allowed_cpus()] { return sample_proc_stat(cpus); }) {}

RuntimeThreads::RuntimeThreads(std::int64_t configured, int local_ranks, spdlog::logger& log, int cores, Sampler sample)
    : log_(log),
      adapts_(configured <= 0),
      local_ranks_(std::max(1, local_ranks)),
      cores_(std::max(1, cores)),
      sample_(std::move(sample)) {
  if (!adapts_) {
    threads_ = static_cast<int>(configured);
    at::set_num_threads(threads_);
    return;
  }
  // The load now: 100 ms of it (a tenth of a second of each core is 10 clock ticks).
  const auto before = sample_();
  if (before) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  last_ = sample_();
  const detail::ThreadChoice c = choose(before, last_);
  threads_ = c.threads;
  at::set_num_threads(threads_);
  log_.info("runtime.num_threads = 0: {}", c.reason);
}

void RuntimeThreads::at_epoch() {
  if (!adapts_) return;
  const auto now = sample_();
  const detail::ThreadChoice c = choose(last_, now);
  last_ = now;
  if (c.threads == threads_) return;
  threads_ = c.threads;
  at::set_num_threads(threads_);
  log_.info("runtime.num_threads = 0: {} from here on", c.reason);
}

detail::ThreadChoice RuntimeThreads::choose(const std::optional<Sample>& since,
                                            const std::optional<Sample>& now) const {
  detail::CpuLoad load;
  load.cores = cores_;
  load.local_ranks = local_ranks_;
  if (since && now) {
    load.other_busy = detail::other_busy(since->cpus, now->cpus, now->own_cpu_s - since->own_cpu_s,
                                         std::chrono::duration<double>(now->at - since->at).count(), local_ranks_);
  }
  return detail::choose_threads(load);
}

}  // namespace trainer
