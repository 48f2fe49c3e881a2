// runtime.num_threads = 0's choice from the load: /proc/stat's text as a loaded or idle 2-core
// machine writes it, and the numbers the choice is made of. Nothing here reads the real
// machine's load.
#include <gtest/gtest.h>

#include <string>

#include "util/cpu_load.h"

namespace trainer::detail {
namespace {

/// /proc/stat with the aggregate line first, two CPUs whose (user, system, idle) ticks are given,
/// and the lines that follow them on Linux.
std::string proc_stat(long user0, long system0, long idle0, long user1, long system1, long idle1) {
  const auto cpu = [](int n, long user, long system, long idle) {
    return "cpu" + std::to_string(n) + " " + std::to_string(user) + " 0 " + std::to_string(system) + " " +
           std::to_string(idle) + " 0 0 0 0 0 0\n";
  };
  return "cpu  " + std::to_string(user0 + user1) + " 0 " + std::to_string(system0 + system1) + " " +
         std::to_string(idle0 + idle1) + " 0 0 0 0 0 0\n" + cpu(0, user0, system0, idle0) +
         cpu(1, user1, system1, idle1) + "intr 12345 0 0\nctxt 999\nbtime 1764000000\nprocesses 4242\n";
}

/// The load between two /proc/stat texts one second apart (100 ticks a CPU), with this process
/// having used `own_cpu_s` seconds of CPU.
std::optional<double> load_between(const std::string& a, const std::string& b, double own_cpu_s, int ranks = 1) {
  const auto before = parse_proc_stat(a, {}), after = parse_proc_stat(b, {});
  EXPECT_TRUE(before && after);
  return other_busy(*before, *after, own_cpu_s, 1.0, ranks);
}

TEST(CpuLoad, ProcStatSumsTheCpuLinesOfTheCpusAllowed) {
  const std::string text = proc_stat(10, 5, 100, 20, 10, 50);
  const auto all = parse_proc_stat(text, {});
  ASSERT_TRUE(all);
  EXPECT_EQ(all->cpus, 2);
  EXPECT_DOUBLE_EQ(all->busy, 45);
  EXPECT_DOUBLE_EQ(all->total, 195);
  const auto one = parse_proc_stat(text, {1});  // taskset -c 1: only CPU 1 is this process's
  ASSERT_TRUE(one);
  EXPECT_EQ(one->cpus, 1);
  EXPECT_DOUBLE_EQ(one->busy, 30);
  // irq, softirq and steal are busy; iowait is idle; an older kernel's four columns are enough.
  const auto cols = parse_proc_stat("cpu0 1 2 3 4 5 6 7 8 9 10\ncpu12 1 1 1 7\n", {});
  ASSERT_TRUE(cols);
  EXPECT_EQ(cols->cpus, 2);
  EXPECT_DOUBLE_EQ(cols->busy, 1 + 2 + 3 + 6 + 7 + 8 + 3);
  EXPECT_DOUBLE_EQ(cols->total, cols->busy + 4 + 5 + 7);
}

TEST(CpuLoad, UnreadableProcStatIsUnknownLoad) {
  EXPECT_FALSE(parse_proc_stat("", {}));
  EXPECT_FALSE(parse_proc_stat("cpu  1 2 3 4\nintr 1\n", {}));  // no CPU line of its own
  EXPECT_FALSE(parse_proc_stat("cpu0 1 2 x 4\n", {}));
  EXPECT_FALSE(parse_proc_stat("cpu0 1 2 3\n", {}));
  EXPECT_FALSE(parse_proc_stat("cpu0 1 -2 3 4\n", {}));
  EXPECT_FALSE(parse_proc_stat(proc_stat(1, 1, 1, 1, 1, 1), {7}));  // not among the CPUs allowed
  // Samples that cannot be compared: no time passed, counters that went back, other CPUs.
  const auto a = parse_proc_stat(proc_stat(100, 0, 100, 100, 0, 100), {});
  const auto one = parse_proc_stat(proc_stat(100, 0, 100, 100, 0, 100), {0});
  EXPECT_FALSE(other_busy(*a, *a, 0, 1, 1));
  EXPECT_FALSE(other_busy(*a, *parse_proc_stat(proc_stat(50, 0, 100, 100, 0, 100), {}), 0, 1, 1));
  EXPECT_FALSE(other_busy(*one, *a, 0, 1, 1));
  EXPECT_FALSE(other_busy(*a, *parse_proc_stat(proc_stat(200, 0, 100, 200, 0, 100), {}), 0, 0, 1));
  const ThreadChoice c = choose_threads({4, std::nullopt, 2});
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.reason, "2 threads (4 cores, shared by 2 ranks; their load could not be read)");
}

// The machine of the report: 2 cores, another job keeping one busy and most of the other.
TEST(CpuLoad, ABusyTwoCoreMachineGetsOneThread) {
  const std::string a = proc_stat(1000, 100, 5000, 2000, 100, 4000);
  const auto busy = load_between(a, proc_stat(1095, 105, 5000, 2060, 110, 4030), 0.0);
  ASSERT_TRUE(busy);
  EXPECT_NEAR(*busy, 1.7, 1e-12);
  const ThreadChoice c = choose_threads({2, busy, 1});
  EXPECT_EQ(c.threads, 1);
  EXPECT_EQ(c.reason, "1 thread (2 cores, 1.7 busy with other work)");
  // One core busy with other work: still 1 (the other thread would share its core).
  EXPECT_EQ(choose_threads({2, load_between(a, proc_stat(1100, 100, 5000, 2002, 100, 4098), 0.0), 1}).threads, 1);
}

TEST(CpuLoad, AnIdleMachineGetsEveryCore) {
  const std::string a = proc_stat(1000, 100, 5000, 2000, 100, 4000);
  // A daemon's few ticks are noise: a core 3/4 free or more counts.
  const auto busy = load_between(a, proc_stat(1003, 101, 5096, 2004, 100, 4096), 0.0);
  ASSERT_TRUE(busy);
  EXPECT_NEAR(*busy, 0.08, 1e-12);
  const ThreadChoice c = choose_threads({2, busy, 1});
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.reason, "2 threads (2 cores, 0.1 busy with other work)");
  EXPECT_EQ(choose_threads({2, 0.3, 1}).threads, 1);
  EXPECT_EQ(choose_threads({1, 0.0, 1}).reason, "1 thread (1 core, 0.0 busy with other work)");
}

// This process's own threads are not other work: both cores busy, one of them with this run.
TEST(CpuLoad, ThisProcessesOwnUseIsNotOtherWork) {
  const std::string a = proc_stat(1000, 100, 5000, 2000, 100, 4000);
  const std::string b = proc_stat(1100, 100, 5000, 2100, 100, 4000);
  EXPECT_NEAR(*load_between(a, b, 2.0), 0.0, 1e-12);  // all of it this run's (2 threads)
  EXPECT_EQ(choose_threads({2, load_between(a, b, 2.0), 1}).threads, 2);
  EXPECT_NEAR(*load_between(a, b, 1.0), 1.0, 1e-12);  // one core's worth someone else's
  EXPECT_EQ(choose_threads({2, load_between(a, b, 1.0), 1}).threads, 1);
  // Two ranks of this job on the host, each using one core: nothing else.
  EXPECT_NEAR(*load_between(a, b, 1.0, 2), 0.0, 1e-12);
}

// Data-parallel ranks on one host share its cores, and what other work leaves of them.
TEST(CpuLoad, RanksOnOneHostShareTheCores) {
  EXPECT_EQ(choose_threads({8, 0.0, 2}).threads, 4);
  const ThreadChoice c = choose_threads({8, 1.7, 2});
  EXPECT_EQ(c.threads, 3);  // 6.3 free: 3.15 each
  EXPECT_EQ(c.reason, "3 threads (8 cores, 1.7 busy with other work, shared by 2 ranks)");
  EXPECT_EQ(choose_threads({2, 0.0, 4}).threads, 1);  // more ranks than cores: at least 1
  EXPECT_EQ(choose_threads({7, 0.0, 2}).threads, 3);  // never more than the rank's share of all cores
  EXPECT_EQ(choose_threads({2, 5.0, 1}).threads, 1);  // busier than the cores: at least 1
}

}  // namespace
}  // namespace trainer::detail
