#pragma once
// Private: one connection to the group's store that rank 0 hosts (store_server.h), as the
// c10d::Store that Gloo's rendezvous and the process group use. Each request waits for its
// answer at most a bounded time (a wait: its own timeout and a little more; any other request:
// the store's timeout), so a rank 0 that stopped makes a request fail instead of hanging. A
// request that failed leaves the connection closed: later ones fail at once, saying why.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "util/torch_compat.h"

namespace trainer {

class GroupStore final : public compat::StoreWithClone<c10d::Store, GroupStore> {
 public:
  /// Connects to `host`:`port`, retrying while nothing listens there (rank 0 not up yet) until
  /// `timeout`, and greets with `group`. Throws std::runtime_error: nothing answered in time, or
  /// the store refused (another group's).
  GroupStore(std::string host, int port, std::string group, std::chrono::milliseconds timeout);
  ~GroupStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  /// The key's value once it exists (waiting at most the store's timeout).
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  /// Waits until every key exists; a timeout of zero waits for ever. Throws on timeout.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  /// Another connection to the same store (LibTorch 2.x's clone()).
  c10::intrusive_ptr<c10d::Store> clone_store();

 private:
  /// Sends `frame` and returns the answer's body after its status (ok), or nullopt for a
  /// timeout status. `answer_within`: how long the answer may take (zero: for ever).
  std::optional<std::vector<std::uint8_t>> call(const std::vector<std::uint8_t>& frame,
                                                std::chrono::milliseconds answer_within);
  /// call() for a request that is never answered with a timeout.
  std::vector<std::uint8_t> answer(const std::vector<std::uint8_t>& frame);
  std::string where() const;

  std::string host_, group_;
  int port_;
  std::mutex mu_;  ///< one request at a time on the connection
  int fd_ = -1;
  std::string broken_;  ///< why the connection was closed
};

}  // namespace trainer
