#pragma once
// Private: how busy the CPUs this process may run on are with other work (from /proc/stat), and
// the intra-op thread count runtime.num_threads = 0 takes from that. Pure functions over text and
// numbers, so that a test feeds them a loaded machine's /proc/stat without one.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::detail {

/// CPU time of a set of CPUs, in clock ticks: /proc/stat's "cpuN" lines summed.
struct CpuTimes {
  double busy = 0;   ///< user, nice, system, irq, softirq, steal (guest time is inside user)
  double total = 0;  ///< busy plus idle and iowait
  int cpus = 0;      ///< the CPU lines summed
};

/// The times of the CPUs numbered in `cpus` (empty: every "cpuN" line) from /proc/stat's text;
/// nullopt when none of them is there or one of their lines cannot be read.
std::optional<CpuTimes> parse_proc_stat(std::string_view text, const std::vector<int>& cpus);

/// Cores' worth busy with other work between two samples of the same CPUs: their busy share of
/// the time since `before`, times the CPUs, less this job's own use (`own_cpu_s` seconds of CPU
/// this process used over `wall_s` seconds, times `local_ranks`: the other data-parallel ranks on
/// this host do the same work). At least 0; nullopt when the samples cannot be compared (other
/// CPUs, no time passed, counters that went back).
std::optional<double> other_busy(const CpuTimes& before, const CpuTimes& after, double own_cpu_s, double wall_s,
                                 int local_ranks);

/// What runtime.num_threads = 0 decides from.
struct CpuLoad {
  int cores = 1;  ///< CPUs this process may run on (its affinity)
  /// Of them, cores' worth busy with other work (other_busy); nullopt when it could not be read.
  std::optional<double> other_busy;
  int local_ranks = 1;  ///< this job's processes on this host sharing the cores (LOCAL_WORLD_SIZE)
};

/// The intra-op thread count, and why, for the log ("1 thread (2 cores, 1.7 busy with other
/// work)").
struct ThreadChoice {
  int threads = 1;
  std::string reason;
};

/// Each rank's share of the cores other work leaves free: floor(free / local_ranks + 0.25), at
/// least 1 and at most the rank's share of all cores. A core counts when at least 3/4 of it is
/// free: a parallel region waits for its slowest thread, so a thread on a core shared with other
/// work slows every region down. Unknown load: the rank's share of all cores.
ThreadChoice choose_threads(const CpuLoad& load);

}  // namespace trainer::detail
