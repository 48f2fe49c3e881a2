// Process groups over c10d: torchrun's variables read and checked; two real processes over
// 127.0.0.1 forming a Gloo group (sums, broadcast of a module, mean gradients in buckets); a rank
// that leaves makes the other fail within the timeout, naming it.
#include "trainer/distributed.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "dist/dp_util.h"
#include "support/test_util.h"
#include "trainer/error.h"

namespace {

using trainer::testing::read_file;
using trainer::testing::TempDir;

const char* kVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};

/// Sets torchrun's variables for the test's duration, and clears them after.
struct Vars {
  explicit Vars(const std::vector<std::pair<std::string, std::string>>& set) {
    for (const char* v : kVars) ::unsetenv(v);
    for (const auto& [k, v] : set) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~Vars() {
    for (const char* v : kVars) ::unsetenv(v);
  }
};

std::string usage_error() {
  try {
    trainer::DistEnv::from_env();
  } catch (const trainer::UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(DistEnv, NoVariablesIsARunOfOne) {
  Vars v(std::vector<std::pair<std::string, std::string>>{});
  const auto env = trainer::DistEnv::from_env();
  EXPECT_FALSE(env.active());
  EXPECT_EQ(env.world_size, 1);
  Vars one({{"WORLD_SIZE", "1"}, {"RANK", "0"}});
  EXPECT_FALSE(trainer::DistEnv::from_env().active());
}

TEST(DistEnv, ReadsTorchrunsVariables) {
  Vars v({{"RANK", "3"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"}});
  const auto env = trainer::DistEnv::from_env();
  EXPECT_TRUE(env.active());
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(DistEnv, InconsistentVariablesAreUsageErrorsNamingThem) {
  {
    Vars v({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_PORT", "x"}});
    const std::string e = usage_error();
    EXPECT_NE(e.find("RANK=2: expected an integer in [0, 1]"), std::string::npos) << e;
    EXPECT_NE(e.find("MASTER_PORT=x: expected an integer in [1, 65535]"), std::string::npos) << e;
    EXPECT_NE(e.find("MASTER_ADDR is not set"), std::string::npos) << e;
  }
  {
    Vars v(std::vector<std::pair<std::string, std::string>>{{"RANK", "1"}});
    EXPECT_NE(usage_error().find("RANK is set but WORLD_SIZE is not"), std::string::npos) << usage_error();
  }
}

/// Starts rank `rank` of 2 running the probe in `mode`, output to <tmp>/rank<r>.out/.err.
std::string rank_command(const TempDir& tmp, int rank, int port, const std::string& mode, int timeout_ms) {
  return trainer::testing::rank_env(rank, 2, port) + DIST_PROBE + " " + mode + " " + std::to_string(timeout_ms) +
         " > " + (tmp / ("rank" + std::to_string(rank) + ".out")) + " 2> " +
         (tmp / ("rank" + std::to_string(rank) + ".err"));
}

TEST(ProcessGroup, TwoRanksOverLoopbackSumBroadcastAndAverageGradients) {
  TempDir tmp;
  const int port = trainer::free_loopback_port();
  trainer::testing::Child r0("env " + rank_command(tmp, 0, port, "collectives", 60000));
  trainer::testing::Child r1("env " + rank_command(tmp, 1, port, "collectives", 60000));
  EXPECT_EQ(WEXITSTATUS(r0.wait()), 0) << read_file(tmp / "rank0.err");
  EXPECT_EQ(WEXITSTATUS(r1.wait()), 0) << read_file(tmp / "rank1.err");
  const std::string out0 = read_file(tmp / "rank0.out"), out1 = read_file(tmp / "rank1.out");
  EXPECT_NE(out0.find("joined rank 0 of 2"), std::string::npos) << out0;
  EXPECT_NE(out1.find("joined rank 1 of 2"), std::string::npos) << out1;
  for (const auto& out : {out0, out1}) {
    // A write to a rank killed mid-collective fails with EPIPE instead of ending this one.
    EXPECT_NE(out.find("SIGPIPE ignored\n"), std::string::npos) << out;
    EXPECT_NE(out.find("sum 3\n"), std::string::npos) << out;   // 1 + 2
    EXPECT_NE(out.find("max 10\n"), std::string::npos) << out;  // rank 1's
    EXPECT_NE(out.find("grad 1.5 0.5\n"), std::string::npos) << out;
    EXPECT_NE(out.find("done"), std::string::npos) << out;
  }
  // Rank 0's weights on both.
  const auto weights = [](const std::string& out) { return out.substr(out.find("weights"), 20); };
  EXPECT_EQ(weights(out0), weights(out1));
}

TEST(ProcessGroup, ARankThatLeavesMakesTheOtherFailInsteadOfWaiting) {
  TempDir tmp;
  const int port = trainer::free_loopback_port();
  trainer::testing::Child r0("env " + rank_command(tmp, 0, port, "collectives", 5000));
  trainer::testing::Child r1("env " + rank_command(tmp, 1, port, "leave", 5000));
  EXPECT_EQ(WEXITSTATUS(r1.wait()), 0) << read_file(tmp / "rank1.err");
  EXPECT_EQ(WEXITSTATUS(r0.wait()), 3) << read_file(tmp / "rank0.out");
  const std::string err = read_file(tmp / "rank0.err");
  EXPECT_NE(err.find("rank 0: all-reduce failed: rank 1 stopped answering"), std::string::npos) << err;
  EXPECT_EQ(err.find("frame #"), std::string::npos) << err;  // c10's backtrace left out
}

TEST(ProcessGroup, RanksOfTwoGroupsOnOnePortDoNotJoinEachOther) {
  // `trainer launch` gives each group its own id; a rank that reaches a store of another group
  // (the port taken again by another run) waits for its own group, which does not form.
  TempDir tmp;
  const int port = trainer::free_loopback_port();
  trainer::testing::Child r0("env TRAINER_GROUP_ID=a1 " + rank_command(tmp, 0, port, "collectives", 2000));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 hosts the store
  trainer::testing::Child r1("env TRAINER_GROUP_ID=b2 " + rank_command(tmp, 1, port, "collectives", 2000));
  EXPECT_EQ(WEXITSTATUS(r0.wait()), 3);
  EXPECT_EQ(WEXITSTATUS(r1.wait()), 3);
  const std::string err0 = read_file(tmp / "rank0.err"), err1 = read_file(tmp / "rank1.err");
  EXPECT_NE(err0.find("did not form within 2 s; ranks that did not join: 1"), std::string::npos) << err0;
  // Rank 1's store check after its timeout may find rank 0 already gone: its own group did not form.
  EXPECT_NE(err1.find("rank 1: the group of 2 at 127.0.0.1:" + std::to_string(port) + " did not form"),
            std::string::npos)
      << err1;
}

TEST(ProcessGroup, AFreePortIsBelowTheRangeOfOutgoingConnectionsAndFree) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  ASSERT_TRUE(range >> low >> high);
  for (int i = 0; i < 20; ++i) {
    const int port = trainer::free_loopback_port();
    if (low - 1 - std::max(1024, low - 10000) >= 1000) {
      EXPECT_GE(port, std::max(1024, low - 10000));
      EXPECT_LT(port, low);
    } else {
      EXPECT_GT(port, 0);  // no room below the range: above it, else the kernel's pick
    }
  }
}

TEST(ProcessGroup, ARankThatNeverComesMakesTheOthersJoinFail) {
  TempDir tmp;
  const int port = trainer::free_loopback_port();
  trainer::testing::Child r0("env " + rank_command(tmp, 0, port, "collectives", 2000));
  EXPECT_EQ(WEXITSTATUS(r0.wait()), 3);
  const std::string err = read_file(tmp / "rank0.err");
  EXPECT_NE(err.find("rank 0: the group of 2 at 127.0.0.1:" + std::to_string(port) +
                     " did not form within 2 s; ranks that did not join: 1"),
            std::string::npos)
      << err;
}

}  // namespace
