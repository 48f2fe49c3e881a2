// A data-parallel run's process group: joining it, and the collectives on its Gloo group and its
// store (gradients and module state among them).
#include "trainer/distributed.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "dist/grad_sync.h"
#include "dist/group_store.h"
#include "dist/process_group_impl.h"
#include "dist/store_wire.h"
#include "trainer/error.h"

namespace trainer {

namespace {

/// TRAINER_GROUP_ID (which `trainer launch` sets) followed by '/', or nothing when unset.
std::string group_id() {
  const char* v = std::getenv("TRAINER_GROUP_ID");
  if (v == nullptr || *v == '\0') return "";
  const std::string id(v);
  TRAINER_CHECK_T(
      UsageError,
      id.size() <= 64 &&
          std::all_of(id.begin(), id.end(),
                      [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }),
      "TRAINER_GROUP_ID='", id.substr(0, 80), id.size() > 80 ? "...'" : "'",
      ": expected at most 64 letters, digits, '-' or '_' (trainer launch sets it)");
  return id + "/";
}

/// Gloo writes to its peers with writev(), which raises SIGPIPE when the peer's end is closed
/// (a rank killed mid-collective): by default that signal ends this process at once, without
/// the error, status or checkpoint the other ranks owe the run. With SIGPIPE ignored the write
/// fails with EPIPE, Gloo throws, and the collective's failure names the lost rank. Python
/// ignores SIGPIPE at start-up, which is why torch.distributed never meets it. A handler the
/// program installed itself is left alone.
void ignore_broken_pipes() {
  struct sigaction now {};
  if (::sigaction(SIGPIPE, nullptr, &now) != 0 || now.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
}

/// How each connection to the group's store is made, under the group's `prefix`. Rank 0 hosts
/// trainer's own store (StoreServer) and every rank connects to it, greeting with the prefix;
/// under torchrun's agent store the agent hosts c10d's TCPStore, and the ranks are its clients.
std::function<c10::intrusive_ptr<c10d::Store>()> store_connector(const DistEnv& env, const std::string& prefix,
                                                                 std::chrono::milliseconds timeout, bool agent_store) {
  if (agent_store) {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(env.master_port);
    o.isServer = false;
    o.numWorkers = static_cast<std::size_t>(env.world_size);
    o.waitWorkers = false;  // the group's forming below waits, and can then say who is missing
    o.timeout = timeout;
    return [addr = env.master_addr, o, prefix]() -> c10::intrusive_ptr<c10d::Store> {
      return c10::make_intrusive<c10d::PrefixStore>(prefix, c10::make_intrusive<c10d::TCPStore>(addr, o));
    };
  }
  return [addr = env.master_addr, port = static_cast<int>(env.master_port), prefix,
          timeout]() -> c10::intrusive_ptr<c10d::Store> {
    return c10::make_intrusive<c10d::PrefixStore>(prefix, c10::make_intrusive<GroupStore>(addr, port, prefix, timeout));
  };
}

/// Rank 0's store listens on MASTER_ADDR only. A group across hosts (LOCAL_WORLD_SIZE <
/// WORLD_SIZE) whose MASTER_ADDR is a loopback address on rank 0's host (a host name that
/// /etc/hosts maps to 127.0.1.1, as Debian's does) could not be reached from the other hosts.
void check_store_reachable(const DistEnv& env) {
  if (env.rank != 0 || env.local_world_size >= env.world_size) return;
  std::vector<sockaddr_storage> addresses;
  try {
    addresses = store_wire::resolve(env.master_addr, static_cast<int>(env.master_port));
  } catch (const store_wire::WireError&) {
    return;  // said when the store is made
  }
  if (!std::all_of(addresses.begin(), addresses.end(), store_wire::is_loopback)) return;
  throw UsageError(fmt::format(
      "MASTER_ADDR={} is {} on rank 0's host, a loopback address, but the group spans hosts (LOCAL_WORLD_SIZE={}, "
      "WORLD_SIZE={}): rank 0's store listens on MASTER_ADDR only, where the other hosts cannot reach it; set "
      "MASTER_ADDR to the address of rank 0's host that the others use",
      env.master_addr, store_wire::to_string(addresses.front()), env.local_world_size, env.world_size));
}

}  // namespace

ProcessGroup::ProcessGroup(const DistEnv& env, std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>()) {
  TRAINER_CHECK_T(UsageError, env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, "rank ", env.rank,
                  " of ", env.world_size, ": not a place in the group");
  impl_->rank = env.rank;
  impl_->size = env.world_size;
  impl_->timeout = timeout;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  const std::string group = group_id();
  ignore_broken_pipes();
  check_store_reachable(env);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    // torchrun's agent hosts the store itself when it says so; the ranks then only connect.
    const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    const bool agent_store = agent && std::string(agent) == "True";
    // A restarted torchrun group (TORCHELASTIC_RESTART_COUNT) starts from fresh keys; the keys
    // of a `trainer launch` group are its own (TRAINER_GROUP_ID), so that a rank that reaches
    // another group's store (its port reused) never joins that group.
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const std::string prefix = "trainer/" + group + std::string(restart ? restart : "0");
    if (env.rank == 0 && !agent_store) {
      impl_->server = std::make_unique<StoreServer>(env.master_addr, static_cast<int>(env.master_port), prefix);
    }
    impl_->connect = store_connector(env, prefix, timeout, agent_store);
    store = impl_->connect();
    store->set("joined/" + std::to_string(env.rank), std::vector<std::uint8_t>{1});
    impl_->store = store;
    impl_->start_heartbeat();
  } catch (const std::exception& e) {
    impl_->stop_heartbeat();
    throw Error(fmt::format("rank {}: cannot {} the group's store at {} (MASTER_ADDR:MASTER_PORT): {}", env.rank,
                            env.rank == 0 ? "host" : "reach", where, message_of(e)));
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
    throw Error(fmt::format("rank {}: the group of {} at {} did not form within {:g} s; ranks that did not join: {}",
                            env.rank, env.world_size, where, timeout.count() / 1000.0,
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
    throw Error(fmt::format("rank {}: waiting for rank {} {} failed: {}", impl_->rank, root, what, why));
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
  // One collective per tensor keeps each in place (the module's own storage). Gloo sends a
  // tensor's memory as it lies: a tensor in another layout than rank 0's (channels-last on one
  // rank only) would receive rank 0's values in the wrong places. Each goes as a contiguous copy
  // in logical order, and comes back into the tensor's own layout.
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t.contiguous()};
    pg.broadcast(one, 0);
    if (!one[0].is_same(t)) t.copy_(one[0]);
  }
}

}  // namespace trainer
