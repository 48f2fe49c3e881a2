#pragma once
// Private: what a ProcessGroup (trainer/distributed.h) holds: the group's store, its Gloo group and
// the heartbeat that names a lost rank. Needs USE_C10D_GLOO, as c10d's Gloo header does.
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dist/store_server.h"
#include "trainer/distributed.h"
#include "trainer/error.h"

namespace trainer {

/// What a c10d error says, without the backtrace c10::Error carries.
std::string message_of(const std::exception& e);

struct ProcessGroup::Impl {
  std::int64_t rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};
  /// The store rank 0 hosts (null on the other ranks, and under torchrun's agent store). Declared
  /// first: it goes last, after every connection to it.
  std::unique_ptr<StoreServer> server;
  /// A new connection to the group's store, under the group's prefix: the run's own, and the
  /// ones the heartbeat and the liveness probe open for themselves.
  std::function<c10::intrusive_ptr<c10d::Store>()> connect;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;

  // The heartbeat: every rank counts up its key in the store twice a second, on a connection of
  // its own, so that after a failed collective the survivors can tell which ranks are gone. Its
  // state is shared with the thread: a thread stuck in the store (rank 0 stopped, its server
  // with it) is left behind instead of joined, and the process still ends.
  struct Beat {
    std::mutex mutex;
    std::condition_variable cv;
    bool stop = false;
    bool done = false;
    /// Collectives this rank has started; the heartbeat publishes the count, so that after a
    /// timeout the others can tell a rank that is alive but elsewhere from one in step.
    std::atomic<std::int64_t> started{0};
  };
  std::shared_ptr<Beat> beat_state = std::make_shared<Beat>();
  std::thread beat;

  static constexpr std::chrono::milliseconds kBeat{500};

  static std::string beat_key(std::int64_t r) { return "beat/" + std::to_string(r); }
  static std::string started_key(std::int64_t r) { return "started/" + std::to_string(r); }

  void start_heartbeat();

  void stop_heartbeat();

  static constexpr const char* kStoreGone =
      "the group's store does not answer: rank 0, which hosts it, died, was killed or is stopped";

  /// Whether the store answers within `limit`. Asked on a connection of its own from a thread
  /// of its own, which is left behind when the answer does not come: the server of a stopped
  /// rank 0 leaves any store call waiting for ever (even a wait with a timeout: LibTorch 2.x
  /// then waits for the server to acknowledge the cancel), and the run's own connection must
  /// stay usable.
  bool store_answers(std::chrono::milliseconds limit) const;

  /// The ranks whose heartbeat stopped: their counts, read twice 2.5 beats apart, did not move;
  /// with `behind`, also those alive that started fewer collectives than this one. Said as a
  /// sentence for an error message; empty when every rank still beats (and is in step).
  std::string lost_ranks(bool behind = true);

  /// Starts a collective (any thread): counted for the heartbeat, its errors as guarded() says.
  template <class F>
  auto collective(const char* what, F f) -> decltype(f()) {
    beat_state->started.fetch_add(1);
    return guarded(what, f);
  }

  /// c10d's errors (a peer gone, a timeout) as trainer::Error saying which collective, where,
  /// and which rank was lost.
  template <class F>
  auto guarded(const char* what, F f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string lost = lost_ranks();
      throw Error(fmt::format("rank {}: {} failed: {} ({})", rank, what,
                              lost.empty() ? fmt::format("every rank's heartbeat still runs (a rank did not reach this "
                                                         "collective within {:g} s, or the collective failed here)",
                                                         timeout.count() / 1000.0)
                                           : lost,
                              message_of(e)));
    }
  }
};

}  // namespace trainer
