#pragma once
// Private: the group's store as rank 0 hosts it: keys and values in memory, served over TCP to
// the ranks' GroupStore connections (store_wire.h says the frames).
//
// It listens on the addresses MASTER_ADDR resolves to (127.0.0.1 for `trainer launch`), each of
// them, never on every address of the host, and each connection has a thread of its own, so a
// peer that sends half a request, or none, holds up nobody but itself. Every limit is checked
// before anything is allocated for it:
//   - a connection must greet within kGreeting with the group's id, else it is closed; a peer
//     of another group (another TRAINER_GROUP_ID) is told so and closed;
//   - the greeting (the first frame) is refused from its announced length when over
//     kMaxGreeting, any later frame when over store_wire::kMaxFrame, and a frame begun must be
//     whole within kRest;
//   - at most kMaxUngreeted connections that have not greeted yet: past that, the oldest of
//     them is told why and closed, so that idle connections from anyone who can reach the port
//     never crowd out the ranks' (which greet at once);
//   - at most kMaxConnections connections at once, and kMaxStoredBytes of keys and values.
// The store is not authenticated: on several hosts it must be on a network whose hosts are
// trusted (docs/distributed.md).
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace trainer {

class StoreServer {
 public:
  static constexpr std::chrono::milliseconds kGreeting{10'000};
  static constexpr std::chrono::milliseconds kRest{10'000};
  static constexpr std::size_t kMaxConnections = 1024;
  static constexpr std::size_t kMaxUngreeted = 64;
  static constexpr std::uint32_t kMaxGreeting = 4096;  ///< a group's id is some 30 bytes
  static constexpr std::size_t kMaxStoredBytes = std::size_t{1} << 30;

  /// Listens at `port` on each address `host` resolves to (listen_addresses), for the
  /// connections that greet with `group`. Throws std::runtime_error naming the addresses.
  StoreServer(const std::string& host, int port, std::string group);
  /// The same on `addresses` as resolved (each with its port).
  StoreServer(const std::vector<sockaddr_storage>& addresses, std::string group);
  /// Closes every connection (their waits end) and stops listening.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  /// Where it listens ("127.0.0.1:29500", "[::1]:29500, 127.0.0.1:29500").
  const std::string& address() const { return address_; }

  /// Which of `found` (what a host name resolves to, in order) to listen on: each address once.
  static std::vector<sockaddr_storage> listen_addresses(const std::vector<sockaddr_storage>& found);

 private:
  void start(const std::vector<sockaddr_storage>& addresses, std::string group, const std::string& what);

  struct State;
  std::shared_ptr<State> state_;  ///< shared with each connection's thread
  std::string address_;
  std::thread accept_;
};

}  // namespace trainer
