// runtime.num_threads over a run: the count chosen at the start and again at each epoch from a
// machine whose load the test gives (2 cores), what LibTorch is set to, and the log lines. Nothing
// here reads the real machine's load.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <deque>
#include <sstream>
#include <string>

#include "train/runtime_threads.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

/// A 2-core machine's samples, taken in order: each `seconds` after the one before, the CPUs
/// `busy` cores' worth busy in that time, `own` cores' worth of it this process's.
class FakeMachine {
 public:
  void then(double seconds, double busy, double own) { steps_.push_back({seconds, busy, own}); }
  void unreadable() { steps_.push_back({-1, 0, 0}); }
  RuntimeThreads::Sampler sampler() {
    return [this]() -> std::optional<RuntimeThreads::Sample> {
      ++taken;
      if (steps_.empty()) return std::nullopt;
      const Step s = steps_.front();
      steps_.pop_front();
      if (s.seconds < 0) return std::nullopt;
      // Two CPUs of 100 ticks a second each.
      now_.cpus.total += 200 * s.seconds;
      now_.cpus.busy += 100 * s.seconds * s.busy;
      now_.own_cpu_s += s.seconds * s.own;
      now_.at += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.seconds));
      return now_;
    };
  }
  int taken = 0;

 private:
  struct Step {
    double seconds, busy, own;
  };
  std::deque<Step> steps_;
  RuntimeThreads::Sample now_{{0, 0, 2}, 0, Clock::time_point{}};
};

class RuntimeThreadsTest : public ::testing::Test {
 protected:
  void TearDown() override { at::set_num_threads(before_); }
  std::string lines() const { return text_.str(); }

  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> log_ = [this] {
    auto l = std::make_shared<spdlog::logger>("threads", std::make_shared<spdlog::sinks::ostream_sink_mt>(text_));
    l->set_pattern("%v");
    return l;
  }();
  const int before_ = at::get_num_threads();
};

// Idle at the start: both cores. Another job takes most of the machine during the first epoch:
// one thread from the next epoch on. It goes: both again. No change, no line.
TEST_F(RuntimeThreadsTest, TheDefaultChoosesAgainAtEachEpochFromTheLoadSinceTheLastChoice) {
  FakeMachine m;
  m.then(0, 0, 0);
  m.then(0.1, 0.1, 0);  // the start's 100 ms: a daemon's few ticks
  RuntimeThreads t(0, 1, *log_, 2, m.sampler());
  EXPECT_EQ(t.threads(), 2);
  EXPECT_EQ(at::get_num_threads(), 2);
  EXPECT_EQ(lines(), "runtime.num_threads = 0: 2 threads (2 cores, 0.1 busy with other work)\n");

  m.then(10, 1.9, 0.2);  // the first epoch: 1.7 cores' worth someone else's
  t.at_epoch();
  EXPECT_EQ(t.threads(), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  m.then(10, 2.0, 2.0);  // the second: all of it this run's
  t.at_epoch();
  EXPECT_EQ(t.threads(), 2);
  EXPECT_EQ(at::get_num_threads(), 2);
  m.then(10, 2.0, 2.0);
  t.at_epoch();
  EXPECT_EQ(t.threads(), 2);
  EXPECT_EQ(lines(),
            "runtime.num_threads = 0: 2 threads (2 cores, 0.1 busy with other work)\n"
            "runtime.num_threads = 0: 1 thread (2 cores, 1.7 busy with other work) from here on\n"
            "runtime.num_threads = 0: 2 threads (2 cores, 0.0 busy with other work) from here on\n");
}

// A load that cannot be read counts as none: every core, said in the log.
TEST_F(RuntimeThreadsTest, AnUnreadableLoadTakesEveryCore) {
  FakeMachine m;
  m.unreadable();
  m.unreadable();
  RuntimeThreads t(0, 1, *log_, 2, m.sampler());
  EXPECT_EQ(t.threads(), 2);
  EXPECT_EQ(lines(), "runtime.num_threads = 0: 2 threads (2 cores; their load could not be read)\n");
  m.then(0, 0, 0);
  m.then(10, 1.9, 0.0);  // readable again, busy: one thread from the epoch after
  t.at_epoch();
  EXPECT_EQ(t.threads(), 2);  // nothing to compare the first readable sample with
  t.at_epoch();
  EXPECT_EQ(t.threads(), 1);
}

// A count given is kept whatever the load, and the load is never read.
TEST_F(RuntimeThreadsTest, AGivenCountIsKeptWhateverTheLoad) {
  FakeMachine m;
  m.then(10, 2.0, 0);
  RuntimeThreads t(3, 1, *log_, 2, m.sampler());
  t.at_epoch();
  EXPECT_EQ(t.threads(), 3);
  EXPECT_EQ(at::get_num_threads(), 3);
  EXPECT_EQ(m.taken, 0);
  EXPECT_EQ(lines(), "");
}

}  // namespace
}  // namespace trainer
