// The group's store as a unit: a StoreServer on loopback addresses in this process, GroupStore
// connections to it, and raw sockets that break the rules of its frames (core/src/dist/).
#include "dist/group_store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dist/store_server.h"
#include "dist/store_wire.h"
#include "trainer/distributed.h"

namespace {

using trainer::GroupStore;
using trainer::StoreServer;
using namespace std::chrono_literals;

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

/// `ip`:`port` (IPv4) as getaddrinfo gives it.
sockaddr_storage v4(const char* ip, int port) {
  sockaddr_storage s{};
  auto& a = reinterpret_cast<sockaddr_in&>(s);
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  EXPECT_EQ(::inet_pton(AF_INET, ip, &a.sin_addr), 1) << ip;
  return s;
}

/// A raw connection to `ip`:`port`.
int raw_connection(int port, const char* ip = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const sockaddr_storage a = v4(ip, port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(sockaddr_in)), 0) << std::strerror(errno);
  return fd;
}

/// A listening socket of this test's own on `ip`:`port`, or -1 (errno says why).
int plain_listener(const char* ip, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const sockaddr_storage a = v4(ip, port);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(sockaddr_in)) == 0 && ::listen(fd, 4) == 0) return fd;
  const int err = errno;
  ::close(fd);
  errno = err;
  return -1;
}

/// Sends a greeting of the group `group`, as a GroupStore does.
void greet(int fd, const std::string& group) {
  namespace wire = trainer::store_wire;
  const auto frame =
      wire::FrameWriter().u8(static_cast<std::uint8_t>(wire::Op::hello)).str(wire::kMagic).str(group).frame();
  ASSERT_EQ(::send(fd, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
}

/// Everything the peer says until it closes the connection (within 30 s).
std::string read_to_end(int fd) {
  timeval limit{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  std::string out;
  char buf[256];
  ssize_t n = 0;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<std::size_t>(n));
  EXPECT_EQ(n, 0) << "the connection was not closed: " << out;
  return out;
}

TEST(GroupStore, KeysAreSetCountedAndWaitedForAcrossConnections) {
  const int port = trainer::free_loopback_port();
  StoreServer server("127.0.0.1", port, "g");
  EXPECT_EQ(server.address(), "127.0.0.1:" + std::to_string(port));
  GroupStore a("127.0.0.1", port, "g", 5s), b("127.0.0.1", port, "g", 5s);
  EXPECT_FALSE(b.check({"k"}));
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    a.set("k", bytes("value"));
  });
  b.wait({"k"}, 5000ms);  // until a sets it
  later.join();
  EXPECT_EQ(b.get("k"), bytes("value"));
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", -5), -3);
  EXPECT_EQ(a.get("n"), bytes("-3"));  // a count is its decimal text, as in c10d's stores
  EXPECT_TRUE(a.check({"k", "n"}));
  EXPECT_EQ(a.getNumKeys(), 2);
  EXPECT_TRUE(a.deleteKey("k"));
  EXPECT_FALSE(a.deleteKey("k"));
  EXPECT_THROW(b.wait({"k"}, 200ms), std::runtime_error);
  // A timed-out wait is an answer: the connection goes on.
  EXPECT_EQ(b.add("n", 3), 0);
}

TEST(GroupStore, AConnectionOfAnotherGroupIsRefusedAtItsGreeting) {
  const int port = trainer::free_loopback_port();
  StoreServer server("127.0.0.1", port, "trainer/a1/0");
  try {
    GroupStore other("127.0.0.1", port, "trainer/b2/0", 5s);
    FAIL() << "connected to another group's store";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("this store serves another group"), std::string::npos) << e.what();
  }
}

TEST(GroupStore, AFrameOverTheLimitIsRefusedFromItsLengthAlone) {
  const int port = trainer::free_loopback_port();
  StoreServer server("127.0.0.1", port, "g");
  const int peer = raw_connection(port);
  greet(peer, "g");
  const std::string huge = "\xff\xff\xff\x7f";  // 2 GiB announced, nothing sent
  ASSERT_EQ(::send(peer, huge.data(), huge.size(), 0), 4);
  EXPECT_NE(read_to_end(peer).find("a frame of 2147483647 bytes is over the store's limit of 64 MiB"),
            std::string::npos);
  ::close(peer);
}

TEST(GroupStore, AGreetingOverItsSmallLimitIsRefusedFromItsLengthAlone) {
  // Before a peer has said which group it belongs to, its first frame may announce no more than
  // StoreServer::kMaxGreeting (4 KiB), not the 64 MiB of a greeted connection's requests: it is
  // refused at once, nothing read or allocated for it.
  const int port = trainer::free_loopback_port();
  StoreServer server("127.0.0.1", port, "g");
  // 4097 bytes; 64 MiB, what a greeted connection may send at most.
  const std::pair<std::string, std::string> announced[] = {{std::string("\x01\x10\x00\x00", 4), "4097"},
                                                           {std::string("\x00\x00\x00\x04", 4), "67108864"}};
  for (const auto& [length, n] : announced) {
    const int peer = raw_connection(port);
    ASSERT_EQ(::send(peer, length.data(), length.size(), 0), 4);
    const auto start = std::chrono::steady_clock::now();
    const std::string said = read_to_end(peer);
    EXPECT_NE(said.find("a greeting of " + n + " bytes is over the store's limit of 4 KiB"), std::string::npos) << said;
    // Not after the greeting's time ran out (StoreServer::kGreeting, 10 s).
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    ::close(peer);
  }
  // A greeting of a group's id is far below it.
  GroupStore a("127.0.0.1", port, "g", 5s);
  a.set("k", bytes("v"));
  EXPECT_EQ(a.get("k"), bytes("v"));
}

TEST(GroupStore, IdleConnectionsThatNeverGreetCannotCrowdOutTheRanks) {
  // Anyone who can reach the port may open connections and say nothing. More of them than
  // StoreServer::kMaxConnections must not keep a rank from connecting: past kMaxUngreeted
  // connections that have not greeted, the oldest of them is told why and closed.
  const std::size_t idle = StoreServer::kMaxConnections + 16;
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  const rlim_t needed = 2 * idle + 256;  // both ends are in this process
  if (files.rlim_cur < needed) {
    if (files.rlim_max != RLIM_INFINITY && files.rlim_max < needed) {
      GTEST_SKIP() << "this test needs " << needed << " open files; the hard limit is " << files.rlim_max;
    }
    rlimit raised = files;
    raised.rlim_cur = needed;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &raised), 0) << std::strerror(errno);
  }
  const int port = trainer::free_loopback_port();
  StoreServer server("127.0.0.1", port, "g");
  GroupStore before("127.0.0.1", port, "g", 5s);  // a rank connected before they came
  std::vector<int> peers;
  for (std::size_t i = 0; i < idle; ++i) peers.push_back(raw_connection(port));
  GroupStore after("127.0.0.1", port, "g", 5s);  // and one after
  after.set("k", bytes("v"));
  EXPECT_EQ(before.get("k"), bytes("v"));
  EXPECT_EQ(after.add("n", 1), 1);
  // The first of them was made room for, and told why, long before its greeting's time ran out.
  const auto start = std::chrono::steady_clock::now();
  const std::string said = read_to_end(peers.front());
  EXPECT_NE(said.find("closed before its greeting: more than 64 connections to the store had not greeted"),
            std::string::npos)
      << said;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  for (const int fd : peers) ::close(fd);
  if (files.rlim_cur < needed) ::setrlimit(RLIMIT_NOFILE, &files);
}

TEST(GroupStore, TheStoreListensOnEachAddressItIsGivenOnce) {
  // What MASTER_ADDR resolves to (::1 and 127.0.0.1 for "localhost" on many hosts): each
  // address is listened on, as a rank may reach any of them first. Two loopback addresses stand
  // for them here, whatever this host's /etc/hosts says.
  const int port = trainer::free_loopback_port();
  const int probe = plain_listener("127.0.0.2", port);
  if (probe < 0) GTEST_SKIP() << "127.0.0.2 cannot be listened on here: " << std::strerror(errno);
  ::close(probe);
  // An address given twice (two lines of /etc/hosts) is listened on once.
  const std::vector<sockaddr_storage> found{v4("127.0.0.1", port), v4("127.0.0.2", port), v4("127.0.0.1", port)};
  EXPECT_EQ(StoreServer::listen_addresses(found).size(), 2u);
  StoreServer server(found, "g");
  const std::string p = std::to_string(port);
  EXPECT_EQ(server.address(), "127.0.0.1:" + p + ", 127.0.0.2:" + p);
  GroupStore one("127.0.0.1", port, "g", 5s), two("127.0.0.2", port, "g", 5s);
  one.set("k", bytes("v"));
  EXPECT_EQ(two.get("k"), bytes("v"));  // one store behind both
}

TEST(GroupStore, AnAddressNotOnThisHostIsLeftOutButOneTakenEndsTheStore) {
  const int port = trainer::free_loopback_port();
  const std::string p = std::to_string(port);
  // 192.0.2.1 (TEST-NET-1, documentation only) is no address of this host.
  {
    StoreServer server({v4("127.0.0.1", port), v4("192.0.2.1", port)}, "g");
    EXPECT_EQ(server.address(), "127.0.0.1:" + p);
  }
  try {
    StoreServer nowhere({v4("192.0.2.1", port)}, "g");
    ADD_FAILURE() << "listened on no address";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 192.0.2.1:" + p + " (192.0.2.1:" + p + ": "),
              std::string::npos)
        << e.what();
  }
  // The port taken on one of the addresses: a rank might reach whatever listens there.
  const int taken = plain_listener("127.0.0.2", port);
  if (taken < 0) GTEST_SKIP() << "127.0.0.2 cannot be listened on here: " << std::strerror(errno);
  try {
    StoreServer server({v4("127.0.0.1", port), v4("127.0.0.2", port)}, "g");
    ADD_FAILURE() << "listened beside another listener on 127.0.0.2:" << port;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.2:" + p + ": " + std::strerror(EADDRINUSE)), std::string::npos)
        << e.what();
  }
  ::close(taken);
  // What it had bound is given back.
  const int again = plain_listener("127.0.0.1", port);
  EXPECT_GE(again, 0) << std::strerror(errno);
  if (again >= 0) ::close(again);
}

TEST(GroupStore, APeerThatSendsPartOfAFrameHoldsUpNobodyElse) {
  const int port = trainer::free_loopback_port();
  StoreServer server("127.0.0.1", port, "g");
  const int peer = raw_connection(port);
  const std::string part = std::string("\x40\x00\x00\x00\x01", 5);  // 64 bytes announced, 1 sent
  ASSERT_EQ(::send(peer, part.data(), part.size(), 0), 5);
  GroupStore a("127.0.0.1", port, "g", 5s);
  a.set("k", bytes("v"));
  EXPECT_EQ(a.get("k"), bytes("v"));
  // The greeting does not come: the peer is told and closed after StoreServer::kGreeting.
  EXPECT_NE(read_to_end(peer).find("did not come in time"), std::string::npos);
  ::close(peer);
}

TEST(GroupStore, AFieldPastItsFrameIsRefused) {
  const int port = trainer::free_loopback_port();
  StoreServer server("127.0.0.1", port, "g");
  const int peer = raw_connection(port);
  // A greeting frame of 5 bytes whose magic claims 1000.
  const std::string frame = std::string("\x05\x00\x00\x00\x01\xe8\x03\x00\x00", 9);
  ASSERT_EQ(::send(peer, frame.data(), frame.size(), 0), 9);
  EXPECT_NE(read_to_end(peer).find("a field of 1000 bytes goes past its frame's end"), std::string::npos);
  ::close(peer);
}

TEST(GroupStore, NothingListeningIsSaidAfterTheTimeout) {
  const int port = trainer::free_loopback_port();
  try {
    GroupStore a("127.0.0.1", port, "g", 300ms);
    FAIL() << "connected to nothing";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing answered at 127.0.0.1:" + std::to_string(port) + " within 0.3 s"),
              std::string::npos)
        << e.what();
  }
}

TEST(GroupStore, ARequestToAStoppedServerFailsAndTheConnectionStaysClosed) {
  const int port = trainer::free_loopback_port();
  auto server = std::make_unique<StoreServer>("127.0.0.1", port, "g");
  GroupStore a("127.0.0.1", port, "g", 5s);
  a.set("k", bytes("v"));
  server.reset();
  EXPECT_THROW(a.get("k"), std::runtime_error);
  try {
    a.check({"k"});
    FAIL() << "a closed connection answered";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("the group's store at 127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

}  // namespace
