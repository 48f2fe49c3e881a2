#pragma once
// Private: the group's store as rank 0 hosts it: keys and values in memory, served over TCP to
// the ranks' GroupStore connections (store_wire.h says the frames).
//
// It listens on one address only, the one MASTER_ADDR names (127.0.0.1 for `trainer launch`),
// and each connection has a thread of its own, so a peer that sends half a request, or none,
// holds up nobody but itself. Every limit is checked before anything is allocated for it:
//   - a connection must greet within kGreeting with the group's id, else it is closed; a peer
//     of another group (another TRAINER_GROUP_ID) is told so and closed;
//   - a frame over store_wire::kMaxFrame is refused from its announced length, and a frame
//     begun must be whole within kRest;
//   - at most kMaxConnections connections at once, and kMaxStoredBytes of keys and values.
// The store is not authenticated: on several hosts it must be on a network whose hosts are
// trusted (docs/distributed.md).
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

namespace trainer {

class StoreServer {
 public:
  static constexpr std::chrono::milliseconds kGreeting{10'000};
  static constexpr std::chrono::milliseconds kRest{10'000};
  static constexpr std::size_t kMaxConnections = 1024;
  static constexpr std::size_t kMaxStoredBytes = std::size_t{1} << 30;

  /// Listens on `host` (the first address it resolves to that binds) at `port`, for the
  /// connections that greet with `group`. Throws std::runtime_error naming the address.
  StoreServer(const std::string& host, int port, std::string group);
  /// Closes every connection (their waits end) and stops listening.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  /// Where it listens ("127.0.0.1:29500").
  const std::string& address() const { return address_; }

 private:
  struct State;
  std::shared_ptr<State> state_;  ///< shared with each connection's thread
  std::string address_;
  std::thread accept_;
};

}  // namespace trainer
