#pragma once
// Private: LibTorch's intra-op threads for a run. runtime.num_threads as given; 0 adapts to the
// machine: at the run's start (the load over a short sample) and at each later epoch's start
// (the load over the epoch before), each rank's share of the cores that other work leaves free
// (util/cpu_load.h), logged when it changes. On a 2-core machine with another process busy, a
// run with 2 threads waits in every parallel region for the thread that shares its core.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "util/cpu_load.h"

namespace spdlog {
class logger;
}

namespace trainer {

class RuntimeThreads {
 public:
  /// The CPUs' times and this process's CPU time at one moment.
  struct Sample {
    detail::CpuTimes cpus;
    double own_cpu_s = 0;
    std::chrono::steady_clock::time_point at;
  };
  /// Takes a sample; nullopt where the load cannot be read.
  using Sampler = std::function<std::optional<Sample>()>;

  /// Sets the threads: `configured` (runtime.num_threads) when > 0, else chosen from the load
  /// (sampled for ~100 ms) for one of `local_ranks` processes of this job on this host. Logs the
  /// choice.
  RuntimeThreads(std::int64_t configured, int local_ranks, spdlog::logger& log);
  /// The same on `cores` CPUs whose load `sample` reads (a test's machine).
  RuntimeThreads(std::int64_t configured, int local_ranks, spdlog::logger& log, int cores, Sampler sample);

  /// At an epoch's start: with runtime.num_threads = 0, chosen again from the load since the
  /// last choice; logged when it changes.
  void at_epoch();

  int threads() const { return threads_; }

 private:
  /// The choice from the load between `since` and now (unknown without both samples).
  detail::ThreadChoice choose(const std::optional<Sample>& since, const std::optional<Sample>& now) const;

  spdlog::logger& log_;
  const bool adapts_;
  const int local_ranks_;
  const int cores_;  ///< the CPUs this process may run on
  const Sampler sample_;
  int threads_ = 1;
  std::optional<Sample> last_;
};

}  // namespace trainer
