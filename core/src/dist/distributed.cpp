#include "trainer/distributed.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "dist/grad_sync.h"
#include "trainer/error.h"

namespace trainer {

namespace {

/// A variable's value, or nullopt when unset or empty.
std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// An integer variable in [low, high]; appends a problem when it is not one.
std::int64_t env_int(const char* name, std::int64_t low, std::int64_t high, std::vector<std::string>& problems) {
  const auto v = env_value(name);
  if (!v) {
    problems.push_back(detail::str(name, " is not set"));
    return low;
  }
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (errno != 0 || end == v->c_str() || *end != '\0' || x < low || x > high) {
    problems.push_back(detail::str(name, "=", *v, ": expected an integer in [", low, ", ", high, "]"));
    return low;
  }
  return x;
}

/// What a c10d error says, without the backtrace c10::Error carries.
std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace

/// A number torchrun sets (RANK, LOCAL_RANK) in a data-parallel launch (WORLD_SIZE > 1), else
/// `otherwise`. Never throws: the trainer checks the variables when it starts.
static std::int64_t launch_value(const char* name, std::int64_t otherwise) {
  const auto world = env_value("WORLD_SIZE");
  const auto value = env_value(name);
  if (!world || *world == "1" || !value) return otherwise;
  return std::strtoll(value->c_str(), nullptr, 10);
}

std::int64_t rank_of_this_process() { return launch_value("RANK", 0); }

std::int64_t local_rank_of_this_process() { return launch_value("LOCAL_RANK", -1); }

std::string physical_gpu(const c10::Device& device) {
  if (!device.is_cuda()) return "cpu";
  const std::int64_t index = device.has_index() ? device.index() : 0;
  if (const auto visible = env_value("CUDA_VISIBLE_DEVICES")) {
    std::vector<std::string> entries;
    std::string entry;
    for (char c : *visible + ",") {
      if (c == ',') {
        entries.push_back(entry);
        entry.clear();
      } else if (c != ' ') {
        entry += c;
      }
    }
    if (index < static_cast<std::int64_t>(entries.size())) return entries[static_cast<std::size_t>(index)];
  }
  return "cuda:" + std::to_string(index);
}

std::string shared_gpu(const std::vector<std::string>& places) {
  for (std::size_t a = 0; a < places.size(); ++a) {
    const auto space = places[a].rfind(' ');
    if (space == std::string::npos || places[a].substr(space + 1) == "cpu") continue;
    for (std::size_t b = a + 1; b < places.size(); ++b) {
      if (places[b] == places[a]) {
        const std::string gpu = places[a].substr(space + 1);
        return detail::str("ranks ", a, " and ", b, " both use ", gpu.rfind("cuda:", 0) == 0 ? "" : "GPU ", gpu,
                           " on host ", places[a].substr(0, space));
      }
    }
  }
  return "";
}

DistEnv DistEnv::from_env() {
  DistEnv env;
  const auto world = env_value("WORLD_SIZE");
  if (!world || *world == "1") {
    // torchrun with one process, or no launcher: a run of one. A RANK without WORLD_SIZE is a
    // mistake, not a run of one.
    TRAINER_CHECK_T(UsageError, world || !env_value("RANK"),
                    "RANK is set but WORLD_SIZE is not: a data-parallel launch sets both (torchrun, trainer launch)");
    return env;
  }
  std::vector<std::string> problems;
  env.world_size = env_int("WORLD_SIZE", 1, 1 << 20, problems);
  env.rank = env_int("RANK", 0, env.world_size - 1, problems);
  env.local_world_size = env_int("LOCAL_WORLD_SIZE", 1, env.world_size, problems);
  env.local_rank = env_int("LOCAL_RANK", 0, env.local_world_size - 1, problems);
  env.master_port = env_int("MASTER_PORT", 1, 65535, problems);
  if (const auto a = env_value("MASTER_ADDR")) {
    env.master_addr = *a;
  } else {
    problems.push_back("MASTER_ADDR is not set");
  }
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    throw UsageError("a data-parallel launch (WORLD_SIZE=" + *world + ") needs RANK, WORLD_SIZE, LOCAL_RANK, " +
                     "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT: " + all);
  }
  return env;
}

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TRAINER_CHECK(fd >= 0, "no socket to find a free port on 127.0.0.1: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  TRAINER_CHECK(ok, "cannot find a free port on 127.0.0.1; set MASTER_PORT");
  return ntohs(a.sin_port);
}

struct ProcessGroup::Impl {
  std::int64_t rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  // Where the store is, for the connections of their own that the heartbeat and the liveness
  // probe open.
  std::string store_addr, store_prefix;
  c10d::TCPStoreOptions store_options;

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


  void start_heartbeat(const std::string& addr, const c10d::TCPStoreOptions& base, const std::string& prefix) {
    beat = std::thread([state = beat_state, me = rank, addr, base, prefix] {
      try {
        c10d::TCPStoreOptions o = base;
        o.isServer = false;
        c10d::PrefixStore own(prefix, c10::make_intrusive<c10d::TCPStore>(addr, o));
        std::int64_t published = 0;
        std::unique_lock<std::mutex> lock(state->mutex);
        while (!state->stop) {
          lock.unlock();
          own.add(beat_key(me), 1);
          const std::int64_t started = state->started.load();
          if (started != published) {
            own.add(started_key(me), started - published);
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

  void stop_heartbeat() {
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

  static constexpr const char* kStoreGone =
      "the group's store does not answer: rank 0, which hosts it, died, was killed or is stopped";

  /// Whether the store answers within `limit`. Asked on a connection of its own from a thread
  /// of its own, which is left behind when the answer does not come: the server of a stopped
  /// rank 0 leaves any store call waiting for ever (even a wait with a timeout: LibTorch 2.x
  /// then waits for the server to acknowledge the cancel), and the run's own connection must
  /// stay usable.
  bool store_answers(std::chrono::milliseconds limit) const {
    auto answer = std::make_shared<std::promise<bool>>();
    std::future<bool> answered = answer->get_future();
    std::thread([answer, addr = store_addr, options = store_options, prefix = store_prefix] {
      bool ok = false;
      try {
        c10d::TCPStoreOptions o = options;
        o.isServer = false;
        c10d::PrefixStore probe(prefix, c10::make_intrusive<c10d::TCPStore>(addr, o));
        ok = probe.check({"joined/0"});
      } catch (const std::exception&) {
        ok = false;
      }
      answer->set_value(ok);
    }).detach();
    return answered.wait_for(limit) == std::future_status::ready && answered.get();
  }

  /// The ranks whose heartbeat stopped: their counts, read twice 2.5 beats apart, did not move;
  /// with `behind`, also those alive that started fewer collectives than this one. Said as a
  /// sentence for an error message; empty when every rank still beats (and is in step).
  std::string lost_ranks(bool behind = true) {
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
          behind += detail::str(n++ ? ", " : "", r, " (", theirs, " collectives started, this rank ", mine, ")");
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
      throw Error(detail::str(
          "rank ", rank, ": ", what, " failed: ",
          lost.empty() ? detail::str("every rank's heartbeat still runs (a rank did not reach this collective within ",
                                     timeout.count() / 1000.0, " s, or the collective failed here)")
                       : lost,
          " (", message_of(e), ")"));
    }
  }
};

ProcessGroup::ProcessGroup(const DistEnv& env, std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>()) {
  TRAINER_CHECK_T(UsageError, env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, "rank ", env.rank,
                  " of ", env.world_size, ": not a place in the group");
  impl_->rank = env.rank;
  impl_->size = env.world_size;
  impl_->timeout = timeout;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(env.master_port);
    // torchrun's agent hosts the store itself when it says so; the ranks then only connect.
    const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    o.isServer = env.rank == 0 && !(agent && std::string(agent) == "True");
    o.numWorkers = static_cast<std::size_t>(env.world_size);
    o.waitWorkers = false;  // the group's forming below waits, and can then say who is missing
    o.timeout = timeout;
    // A restarted torchrun group (TORCHELASTIC_RESTART_COUNT) starts from fresh keys.
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const std::string prefix = "trainer/" + std::string(restart ? restart : "0");
    store = c10::make_intrusive<c10d::PrefixStore>(prefix, c10::make_intrusive<c10d::TCPStore>(env.master_addr, o));
    store->set("joined/" + std::to_string(env.rank), std::vector<std::uint8_t>{1});
    impl_->store = store;
    impl_->store_addr = env.master_addr;
    impl_->store_prefix = prefix;
    impl_->store_options = o;
    impl_->start_heartbeat(env.master_addr, o, prefix);
  } catch (const std::exception& e) {
    impl_->stop_heartbeat();
    throw Error(detail::str("rank ", env.rank, ": cannot ", env.rank == 0 ? "host" : "reach", " the group's store at ",
                            where, " (MASTER_ADDR:MASTER_PORT): ", message_of(e)));
  }
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    // On one host (loopback), the ranks talk over loopback; across hosts each binds to the
    // address its host name resolves to, as torch.distributed does.
    const bool local = env.master_addr == "127.0.0.1" || env.master_addr == "localhost";
    options->devices.push_back(local ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                     : c10d::ProcessGroupGloo::createDefaultDevice());
    options->threads = 2;
    impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(env.rank),
                                                              static_cast<int>(env.world_size), options);
  } catch (const std::exception& e) {
    impl_->stop_heartbeat();
    std::string missing;
    for (std::int64_t r = 0; r < env.world_size; ++r) {
      try {
        if (!store->check({"joined/" + std::to_string(r)}))
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      } catch (const std::exception&) {
        missing = "unknown (the store at " + where + " is gone)";
        break;
      }
    }
    throw Error(detail::str("rank ", env.rank, ": the group of ", env.world_size, " at ", where,
                            " did not form within ", timeout.count() / 1000.0, " s; ranks that did not join: ",
                            missing.empty() ? std::string("none (") + message_of(e) + ")" : missing));
  }
}

ProcessGroup::~ProcessGroup() { impl_->stop_heartbeat(); }

std::int64_t ProcessGroup::rank() const { return impl_->rank; }
std::int64_t ProcessGroup::size() const { return impl_->size; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->timeout; }

void ProcessGroup::all_reduce_sum(std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return;
  impl_->collective("all-reduce", [&] { impl_->gloo->allreduce(tensors)->wait(); });
}

std::function<void()> ProcessGroup::start_all_reduce_sum(std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return [] {};
  auto work = impl_->collective("all-reduce", [&] { return impl_->gloo->allreduce(tensors); });
  Impl* impl = impl_.get();
  return [impl, work] { impl->guarded("all-reduce", [&] { work->wait(); }); };
}

std::int64_t ProcessGroup::all_reduce_max(std::int64_t value) { return all_reduce_max(std::vector{value}).front(); }

std::vector<std::int64_t> ProcessGroup::all_reduce_max(const std::vector<std::int64_t>& values) {
  if (values.empty()) return {};
  std::vector<at::Tensor> t{at::empty({static_cast<std::int64_t>(values.size())}, at::kLong)};
  std::copy(values.begin(), values.end(), t[0].data_ptr<std::int64_t>());
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  impl_->collective("all-reduce (max)", [&] { impl_->gloo->allreduce(t, o)->wait(); });
  const std::int64_t* v = t[0].data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(v, v + values.size());
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, std::int64_t root) {
  if (tensors.empty()) return;
  c10d::BroadcastOptions o;
  o.rootRank = root;
  impl_->collective("broadcast", [&] { impl_->gloo->broadcast(tensors, o)->wait(); });
}

void ProcessGroup::barrier() {
  // Gloo's monitored barrier names the rank that did not arrive.
  impl_->collective("barrier", [&] { impl_->gloo->monitoredBarrier(c10d::BarrierOptions(), false); });
}

std::string ProcessGroup::share(const std::string& name, const std::string& value, std::int64_t root) {
  const std::string key = "share/" + name;
  return impl_->guarded("sharing a value", [&] {
    if (impl_->rank == root) {
      impl_->store->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
      return value;
    }
    impl_->store->wait({key}, impl_->timeout);
    const auto bytes = impl_->store->get(key);
    return std::string(bytes.begin(), bytes.end());
  });
}

std::vector<std::string> ProcessGroup::gather(const std::string& name, const std::string& value) {
  const std::string prefix = "gather/" + name + "/";
  return impl_->guarded("gathering values", [&] {
    impl_->store->set(prefix + std::to_string(impl_->rank), std::vector<std::uint8_t>(value.begin(), value.end()));
    std::vector<std::string> all;
    for (std::int64_t r = 0; r < impl_->size; ++r) {
      const std::string key = prefix + std::to_string(r);
      impl_->store->wait({key}, impl_->timeout);
      const auto bytes = impl_->store->get(key);
      all.emplace_back(bytes.begin(), bytes.end());
    }
    return all;
  });
}

void ProcessGroup::wait_for_root(const std::string& name, const std::string& what, std::int64_t root) {
  const std::string key = "done/" + name;
  if (impl_->rank == root) {
    impl_->guarded("saying a rank's own work is done", [&] { impl_->store->set(key, std::vector<std::uint8_t>{1}); });
    barrier();  // the others have seen it: rank 0 may end the run and its store with it
    return;
  }
  // Polls the key (a store wait that times out leaves its answer to come later on the connection,
  // which the next request would read), and every few heartbeats whether the root (or the
  // store) is still there.
  const auto fail = [&](const std::string& why) {
    throw Error(detail::str("rank ", impl_->rank, ": waiting for rank ", root, " ", what, " failed: ", why));
  };
  constexpr auto kPoll = std::chrono::milliseconds(20);
  for (auto next_roll_call = std::chrono::steady_clock::now() + Impl::kBeat * 4;;) {
    try {
      if (impl_->store->check({key})) break;
    } catch (const std::exception& e) {
      const std::string lost = impl_->lost_ranks(false);
      fail(lost.empty() ? message_of(e) : lost);
    }
    std::this_thread::sleep_for(kPoll);
    if (std::chrono::steady_clock::now() >= next_roll_call) {
      const std::string lost = impl_->lost_ranks(false);
      if (!lost.empty()) fail(lost);
      next_roll_call = std::chrono::steady_clock::now() + Impl::kBeat * 4;
    }
  }
  barrier();
}

void all_reduce_gradients(ProcessGroup& pg, const std::vector<at::Tensor>& params, double scale,
                          std::int64_t bucket_bytes) {
  const auto buckets = gradient_buckets(params, bucket_bytes);
  for (const auto& bucket : buckets) {
    std::vector<at::Tensor> parts;
    for (std::size_t i : bucket) {
      const auto& p = params[i];
      parts.push_back(p.grad().defined() ? p.grad().reshape({-1}) : at::zeros({p.numel()}, p.options()));
    }
    std::vector<at::Tensor> flat{at::cat(parts)};
    pg.all_reduce_sum(flat);
    if (scale != 1.0) flat[0].mul_(scale);
    std::int64_t offset = 0;
    for (std::size_t i : bucket) {
      at::Tensor p = params[i];
      const at::Tensor g = flat[0].narrow(0, offset, p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(g);
      } else {
        p.mutable_grad() = g.clone();
      }
      offset += p.numel();
    }
  }
}

void broadcast_module_state(ProcessGroup& pg, torch::nn::Module& module) {
  std::vector<at::Tensor> tensors;
  for (const auto& p : module.parameters()) tensors.push_back(p.detach());
  for (const auto& b : module.buffers()) tensors.push_back(b.detach());
  // One collective per tensor keeps each in place (the module's own storage).
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t};
    pg.broadcast(one, 0);
  }
}

}  // namespace trainer
