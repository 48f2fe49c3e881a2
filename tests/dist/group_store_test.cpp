// The group's store as a unit: a StoreServer on 127.0.0.1 in this process, GroupStore
// connections to it, and raw sockets that break the rules of its frames (core/src/dist/).
#include "dist/group_store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "dist/store_server.h"
#include "trainer/distributed.h"

namespace {

using trainer::GroupStore;
using trainer::StoreServer;
using namespace std::chrono_literals;

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

/// A raw connection to 127.0.0.1:`port`.
int raw_connection(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
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
  const std::string huge = "\xff\xff\xff\x7f";  // 2 GiB announced, nothing sent
  ASSERT_EQ(::send(peer, huge.data(), huge.size(), 0), 4);
  EXPECT_NE(read_to_end(peer).find("a frame of 2147483647 bytes is over the store's limit of 64 MiB"),
            std::string::npos);
  ::close(peer);
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
