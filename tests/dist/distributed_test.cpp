// Process groups over c10d: torchrun's variables read and checked; two real processes over
// 127.0.0.1 forming a Gloo group (sums, broadcast of a module, mean gradients in buckets); a rank
// that leaves makes the other fail within the timeout, naming it; a local group listens on
// loopback only, and a peer that speaks out of turn to its store holds up nobody.
#include "trainer/distributed.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
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

/// Starts rank `rank` of `world` (2 unless said) running the probe in `mode`, output to
/// <tmp>/rank<r>.out/.err.
std::string rank_command(const TempDir& tmp, int rank, int port, const std::string& mode, int timeout_ms,
                         int world = 2) {
  return trainer::testing::rank_env(rank, world, port) + DIST_PROBE + " " + mode + " " + std::to_string(timeout_ms) +
         " > " + (tmp / ("rank" + std::to_string(rank) + ".out")) + " 2> " +
         (tmp / ("rank" + std::to_string(rank) + ".err"));
}

/// The local addresses that process `pid` listens on (TCP, IPv4 and IPv6), as /proc/net/tcp*
/// writes them: "0100007F:7530" is 127.0.0.1:30000, each word of an address little-endian.
std::vector<std::string> listening_addresses(pid_t pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream lines(read_file(table));
    std::string line;
    std::getline(lines, line);  // the header
    while (std::getline(lines, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      f >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode) != 0) out.push_back(local);  // 0A: LISTEN
    }
  }
  return out;
}

/// Whether an address as /proc/net/tcp* writes it is a loopback one: 127.x.y.z, ::1 or
/// ::ffff:127.x.y.z.
bool loopback(const std::string& address) {
  const std::string host = address.substr(0, address.find(':'));
  if (host.size() == 8) return host.substr(6) == "7F";
  return host == "00000000000000000000000001000000" ||
         (host.rfind("0000000000000000FFFF0000", 0) == 0 && host.substr(30) == "7F");
}

/// A connection to 127.0.0.1:`port`, made as soon as something listens there (within 60 s).
int connect_when_listening(int port) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

/// Rank 0 of 2 starts and hosts the store; a peer connects to it and sends `bytes` (then keeps
/// the connection open); rank 1 comes. Both ranks must end as usual. Returns the peer's socket.
int ranks_with_a_peer_that_sends(const TempDir& tmp, const std::string& bytes) {
  const int port = trainer::free_loopback_port();
  trainer::testing::Child r0("env " + rank_command(tmp, 0, port, "collectives", 20000));
  const int peer = connect_when_listening(port);
  EXPECT_GE(peer, 0) << read_file(tmp / "rank0.err");
  EXPECT_EQ(::send(peer, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  trainer::testing::Child r1("env " + rank_command(tmp, 1, port, "collectives", 20000));
  EXPECT_EQ(trainer::testing::exit_code_within(r0, std::chrono::seconds(90)), 0) << read_file(tmp / "rank0.err");
  EXPECT_EQ(trainer::testing::exit_code_within(r1, std::chrono::seconds(30)), 0) << read_file(tmp / "rank1.err");
  EXPECT_NE(read_file(tmp / "rank1.out").find("done"), std::string::npos) << read_file(tmp / "rank1.err");
  return peer;
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
  // (the port taken again by another run) is refused there, and rank 0's group does not form.
  TempDir tmp;
  const int port = trainer::free_loopback_port();
  // Rank 0 waits long enough for rank 1 to start on a loaded machine, and rank 1 is refused
  // as soon as it greets.
  trainer::testing::Child r0("env TRAINER_GROUP_ID=a1 " + rank_command(tmp, 0, port, "collectives", 10000));
  ::close(connect_when_listening(port));  // rank 0 hosts the store
  trainer::testing::Child r1("env TRAINER_GROUP_ID=b2 " + rank_command(tmp, 1, port, "collectives", 10000));
  EXPECT_EQ(WEXITSTATUS(r1.wait()), 3);
  EXPECT_EQ(WEXITSTATUS(r0.wait()), 3);
  const std::string err0 = read_file(tmp / "rank0.err"), err1 = read_file(tmp / "rank1.err");
  EXPECT_NE(err0.find("did not form within 10 s; ranks that did not join: 1"), std::string::npos) << err0;
  EXPECT_NE(err1.find("rank 1: cannot reach the group's store at 127.0.0.1:" + std::to_string(port) +
                      " (MASTER_ADDR:MASTER_PORT): the group's store at 127.0.0.1:" + std::to_string(port) +
                      ": this store serves another group"),
            std::string::npos)
      << err1;
}

TEST(ProcessGroup, ALocalGroupListensOnLoopbackOnly) {
  // Ranks 0 and 1 of 3 form the group and wait for rank 2 in Gloo's rendezvous: rank 0 listens
  // for the store and its Gloo pairs, rank 1 for its pairs. Nothing there may listen on an
  // address another host reaches.
  TempDir tmp;
  const int port = trainer::free_loopback_port();
  trainer::testing::Child r0("env " + rank_command(tmp, 0, port, "collectives", 60000, 3));
  trainer::testing::Child r1("env " + rank_command(tmp, 1, port, "collectives", 60000, 3));
  std::vector<std::string> at0, at1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((at0.size() < 2 || at1.empty()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    at0 = listening_addresses(r0.pid());
    at1 = listening_addresses(r1.pid());
  }
  ASSERT_GE(at0.size(), 2u) << read_file(tmp / "rank0.err");  // the store and a Gloo pair
  ASSERT_GE(at1.size(), 1u) << read_file(tmp / "rank1.err");
  for (const auto& a : at0) EXPECT_TRUE(loopback(a)) << "rank 0 listens on " << a;
  for (const auto& a : at1) EXPECT_TRUE(loopback(a)) << "rank 1 listens on " << a;
  trainer::testing::Child r2("env " + rank_command(tmp, 2, port, "collectives", 60000, 3));
  EXPECT_EQ(trainer::testing::exit_code_within(r2, std::chrono::seconds(90)), 0) << read_file(tmp / "rank2.err");
  EXPECT_EQ(trainer::testing::exit_code_within(r0, std::chrono::seconds(30)), 0) << read_file(tmp / "rank0.err");
  EXPECT_EQ(trainer::testing::exit_code_within(r1, std::chrono::seconds(30)), 0) << read_file(tmp / "rank1.err");
}

TEST(ProcessGroup, AGroupAcrossHostsWhoseStoreWouldListenOnLoopbackIsRefused) {
  // One rank per host (LOCAL_WORLD_SIZE 1 of 2), MASTER_ADDR loopback on rank 0's: the other
  // host could never reach the store there.
  const int port = trainer::free_loopback_port();
  const auto out = trainer::testing::run_command(
      "RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 "
      "MASTER_PORT=" +
      std::to_string(port) + " " + DIST_PROBE + " collectives 2000");
  EXPECT_EQ(out.code, 2) << out.text;
  EXPECT_NE(out.text.find("MASTER_ADDR=127.0.0.1 is 127.0.0.1:" + std::to_string(port) +
                          " on rank 0's host, a loopback address, but the group spans hosts (LOCAL_WORLD_SIZE=1, "
                          "WORLD_SIZE=2)"),
            std::string::npos)
      << out.text;
}

TEST(ProcessGroup, APeerThatSendsHalfARequestHoldsUpNobody) {
  // One byte of a request, and then nothing: the group forms and works around it.
  TempDir tmp;
  ::close(ranks_with_a_peer_that_sends(tmp, std::string(1, '\0')));
}

TEST(ProcessGroup, APeerThatAnnouncesAHugeRequestIsRefused) {
  // A request of 3.75 GiB (to c10d's TCPStore, a key of 1 GiB): refused from the length alone,
  // before anything is allocated for it, the connection closed, and the group unharmed.
  TempDir tmp;
  const int peer = ranks_with_a_peer_that_sends(tmp, std::string("\x00\x00\x00\xf0\x40\x00\x00\x00\x00", 9));
  // Rank 0, which hosts the store, stayed far below what was announced.
  std::smatch peak;
  const std::string out0 = read_file(tmp / "rank0.out");
  ASSERT_TRUE(std::regex_search(out0, peak, std::regex("peak ([0-9]+) kB"))) << out0;
  EXPECT_LT(std::stoll(peak[1]), 1024LL * 1024) << out0;  // kB: under 1 GiB
  timeval limit{30, 0};
  ::setsockopt(peer, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  std::string answer;
  char buf[256];
  ssize_t n = 0;
  while ((n = ::recv(peer, buf, sizeof buf, 0)) > 0) answer.append(buf, static_cast<std::size_t>(n));
  EXPECT_EQ(n, 0) << "the store did not close the connection";
  // The first frame of a connection, its greeting, may be no longer than 4 KiB.
  EXPECT_NE(answer.find("a greeting of 4026531840 bytes is over the store's limit of 4 KiB"), std::string::npos)
      << answer;
  ::close(peer);
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
