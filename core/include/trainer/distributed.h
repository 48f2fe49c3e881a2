#pragma once
// Data-parallel runs: the ranks of one run as a process group on PyTorch's own distributed
// engine (c10d: a store of keys that rank 0 hosts, on MASTER_ADDR only; Gloo for tensors on the
// CPU). A process learns its place from the variables torchrun sets (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); a process without them is a run of
// one, as before.
//
//   DistEnv env = DistEnv::from_env();           // UsageError for inconsistent variables
//   if (env.active()) {
//     ProcessGroup pg(env, std::chrono::seconds(60));
//     broadcast_module_state(pg, model);        // every rank starts from rank 0's weights
//     ... backward ...
//     all_reduce_gradients(pg, params, 1.0 / pg.size());  // the mean gradient on every rank
//   }
//
// Every collective waits at most the group's timeout: a rank that died or hangs makes the
// others fail with trainer::Error instead of waiting for ever. Each rank keeps a heartbeat in
// the store (a count it raises twice a second), so the error names the rank that stopped.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/export.h"

namespace torch::nn {
class Module;
}

namespace trainer {

/// This process's rank in a data-parallel launch (RANK when WORLD_SIZE > 1), 0 in a run of one.
/// Never throws (the trainer checks the variables when it starts): plugins that write outside
/// the ranks' shared state — progress lines, MLflow, files in the run directory — do so on rank
/// 0 only.
TRAINER_API std::int64_t rank_of_this_process();

/// A TCP port nobody listens on now, picked at random below the kernel's range for outgoing
/// connections (so no connection of another run takes it before the group's store binds it):
/// the group's port for a launch on one host (`trainer launch` without MASTER_PORT). Throws
/// trainer::Error when none can be had.
TRAINER_API int free_loopback_port();

/// This process's rank on its host (LOCAL_RANK) in a data-parallel launch, -1 in a run of one.
/// A device setting of plain `cuda` means `cuda:<LOCAL_RANK>` in a launch, as torchrun's
/// scripts use it: each rank of a host its own GPU.
TRAINER_API std::int64_t local_rank_of_this_process();

/// Which GPU `device` is on this host, whatever this process's CUDA_VISIBLE_DEVICES: its entry
/// there ("GPU-5f0c..." or "3"), else "cuda:N"; "cpu" for the CPU.
TRAINER_API std::string physical_gpu(const c10::Device& device);

/// The GPUs two ranks share, from each rank's "<host> <physical_gpu>" (index = rank): a
/// sentence naming the first such pair ("ranks 0 and 1 both use GPU 3 on host a"), empty when
/// none does. CPU places are never shared in that sense.
TRAINER_API std::string shared_gpu(const std::vector<std::string>& places);

/// Where this process stands in a launch (torchrun's variables).
struct TRAINER_API DistEnv {
  std::int64_t rank = 0;
  std::int64_t world_size = 1;
  std::int64_t local_rank = 0;
  std::int64_t local_world_size = 1;
  std::string master_addr;  ///< host of rank 0's store
  std::int64_t master_port = 0;

  /// More than one rank.
  bool active() const { return world_size > 1; }

  /// Reads the variables. None set (or WORLD_SIZE=1): a run of one. WORLD_SIZE > 1 needs all
  /// six, each a number in range where it is one (RANK < WORLD_SIZE, LOCAL_RANK <
  /// LOCAL_WORLD_SIZE, a port 1-65535): UsageError naming the variable, its value and what is
  /// allowed otherwise.
  static DistEnv from_env();
};

/// The ranks of one run. Thread-compatible: one thread calls the collectives, in the same order
/// on every rank.
class TRAINER_API ProcessGroup {
 public:
  /// Joins: rank 0 hosts the store at master_addr:master_port (listening on that address only:
  /// unauthenticated, so across hosts on a trusted network), the others connect to it; the
  /// group forms when all world_size ranks have (at most `timeout`, else trainer::Error).
  /// UsageError for a group across hosts whose master_addr is a loopback address on rank 0's.
  ProcessGroup(const DistEnv& env, std::chrono::milliseconds timeout);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  std::int64_t rank() const;
  std::int64_t size() const;
  std::chrono::milliseconds timeout() const;

  /// Sums `tensors` over the ranks, in place (CPU tensors).
  void all_reduce_sum(std::vector<at::Tensor>& tensors);
  /// Starts summing `tensors` over the ranks, in place, and returns at once with the wait:
  /// call it before reading or changing them (it throws as all_reduce_sum would). Collectives
  /// must still start in the same order on every rank; they may start from another thread
  /// (a hook inside the backward) when the calls are not concurrent.
  std::function<void()> start_all_reduce_sum(std::vector<at::Tensor>& tensors);
  /// The largest of `value` over the ranks (the ranks agree on a decision, such as a smaller
  /// micro-batch after one of them ran out of memory).
  std::int64_t all_reduce_max(std::int64_t value);
  /// The elementwise largest of `values` over the ranks (the same length on every rank): several
  /// decisions in one collective (the smallest of a size is the largest of its negation).
  std::vector<std::int64_t> all_reduce_max(const std::vector<std::int64_t>& values);
  /// Copies rank `root`'s tensors into every rank's, in place.
  void broadcast(std::vector<at::Tensor>& tensors, std::int64_t root = 0);
  /// Waits for every rank; a rank that does not arrive within the timeout is named in the
  /// trainer::Error ("rank 1 did not ...").
  void barrier();
  /// Rank `root`'s `value` on every rank (through the store): `name` must be new to the group
  /// each time (the run directory, ...).
  std::string share(const std::string& name, const std::string& value, std::int64_t root = 0);
  /// Every rank's `value`, by rank (through the store; `name` new to the group each time).
  std::vector<std::string> gather(const std::string& name, const std::string& value);
  /// Work that rank `root` does alone while the others wait (rank 0 writing a checkpoint): `root`
  /// calls it when done, every other rank waits for that through the store, as long as it takes
  /// while `root`'s heartbeat runs (distributed.timeout_s does not apply: the wait is not a
  /// collective). A root that stops answering is named in the trainer::Error, with `what` ("writing
  /// a checkpoint"). Every rank returns together (a barrier ends it). `name` must be new to the
  /// group each time.
  void wait_for_root(const std::string& name, const std::string& what, std::int64_t root = 0);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Sums the gradients of `params` over the ranks and multiplies them by `scale` (1 / size for
/// the mean), in buckets of about `bucket_bytes`: each bucket's gradients are flattened into one
/// tensor, reduced with one collective and copied back. Parameters without a gradient on a rank
/// contribute zeros (every rank reduces the same buckets).
TRAINER_API void all_reduce_gradients(ProcessGroup& pg, const std::vector<at::Tensor>& params, double scale,
                                      std::int64_t bucket_bytes = 25 * 1024 * 1024);

/// Copies rank 0's parameters and buffers into every rank's module (same architecture).
TRAINER_API void broadcast_module_state(ProcessGroup& pg, torch::nn::Module& module);

}  // namespace trainer
