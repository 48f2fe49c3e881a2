// A process group's liveness: each rank's heartbeat in the store, and the roll call that names
// the ranks that stopped (or are elsewhere) when a collective fails.
#include "dist/process_group_impl.h"

#include <fmt/format.h>

#include <future>
#include <vector>

namespace trainer {

std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

void ProcessGroup::Impl::start_heartbeat() {
  beat = std::thread([state = beat_state, me = rank, connect = connect] {
    try {
      const auto own = connect();
      std::int64_t published = 0;
      std::unique_lock<std::mutex> lock(state->mutex);
      while (!state->stop) {
        lock.unlock();
        own->add(beat_key(me), 1);
        const std::int64_t started = state->started.load();
        if (started != published) {
          own->add(started_key(me), started - published);
          published = started;
        }
        lock.lock();
        state->cv.wait_for(lock, kBeat, [&] { return state->stop; });
      }
    } catch (const std::exception&) {
      // The store is gone (rank 0 ended): nothing left to tell.
    }
    std::lock_guard<std::mutex> lock(state->mutex);
    state->done = true;
    state->cv.notify_all();
  });
}

void ProcessGroup::Impl::stop_heartbeat() {
  if (!beat.joinable()) return;
  std::unique_lock<std::mutex> lock(beat_state->mutex);
  beat_state->stop = true;
  beat_state->cv.notify_all();
  const bool done = beat_state->cv.wait_for(lock, kBeat * 4, [&] { return beat_state->done; });
  lock.unlock();
  if (done) {
    beat.join();
  } else {
    beat.detach();  // blocked in the store of a stopped rank 0; it owns what it uses
  }
}

bool ProcessGroup::Impl::store_answers(std::chrono::milliseconds limit) const {
  auto answer = std::make_shared<std::promise<bool>>();
  std::future<bool> answered = answer->get_future();
  std::thread([answer, connect = connect] {
    bool ok = false;
    try {
      ok = connect()->check({"joined/0"});
    } catch (const std::exception&) {
      ok = false;
    }
    answer->set_value(ok);
  }).detach();
  return answered.wait_for(limit) == std::future_status::ready && answered.get();
}

std::string ProcessGroup::Impl::lost_ranks(bool behind) {
  if (!store_answers(kBeat * 2)) return kStoreGone;
  try {
    std::vector<std::int64_t> before(static_cast<std::size_t>(size));
    for (std::int64_t r = 0; r < size; ++r) before[static_cast<std::size_t>(r)] = store->add(beat_key(r), 0);
    std::this_thread::sleep_for(kBeat * 5 / 2);
    std::string lost;
    for (std::int64_t r = 0; r < size; ++r) {
      if (r != rank && store->add(beat_key(r), 0) == before[static_cast<std::size_t>(r)]) {
        lost += (lost.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    if (!lost.empty()) {
      return (lost.find(',') == std::string::npos ? "rank " : "ranks ") + lost +
             " stopped answering (died, killed or stopped)";
    }
    if (!behind) return "";
    // Every rank beats: one that has started fewer collectives than this one is alive but has
    // not come to this collective (its count is at most a beat old, and the wait was longer).
    const std::int64_t mine = beat_state->started.load();
    std::string behind;
    int n = 0;
    for (std::int64_t r = 0; r < size; ++r) {
      const std::int64_t theirs = r == rank ? mine : store->add(started_key(r), 0);
      if (theirs < mine) {
        behind += fmt::format("{}{} ({} collectives started, this rank {})", n++ ? ", " : "", r, theirs, mine);
      }
    }
    if (n == 0) return "";
    return (n == 1 ? "rank " : "ranks ") + behind + (n == 1 ? " is" : " are") +
           " alive but not at this collective: busy or stuck outside the collectives (a slow plugin or "
           "data loader, a deadlock)";
  } catch (const std::exception&) {
    return kStoreGone;
  }
}

}  // namespace trainer
