// The CUDA memory backend: compiled only when the LibTorch found has CUDA (core/CMakeLists.txt
// defines TRAINER_WITH_CUDA then). Everything CUDA-specific in trainer is here; the API
// differences between LibTorch 1.13 and 2.x are absorbed in the small shim below.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <ATen/ATen.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <vector>

#include "memory/backend.h"
#include "memory/block_ledger.h"
#include "trainer/error.h"

// The caching allocator's trace trackers (each allocation and free, with its address and size)
// and out-of-memory observers, and torch::cuda::_memory_snapshot_pickled: what the memory
// categories on CUDA are built on. Written against LibTorch 2.11's headers; 2.4 is the oldest
// whose TraceEntry has these fields and whose tracker sees every allocation.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define TRAINER_CUDA_CATEGORIES 1
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

namespace trainer::detail {

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

// --- LibTorch 1.13 / 2.x shim --------------------------------------------------------------
// 1.13: alloc::DeviceStats getDeviceStats(int); 2.x: c10::CachingDeviceAllocator::DeviceStats
// getDeviceStats(c10::DeviceIndex). In both, each Stat array is indexed by StatType and
// AGGREGATE (all pools) is index 0.
constexpr std::size_t kAggregate = 0;
auto device_stats(int device) { return alloc::getDeviceStats(static_cast<c10::DeviceIndex>(device)); }
void empty_cache() { alloc::emptyCache(); }
// -------------------------------------------------------------------------------------------

void check(cudaError_t e, const char* what) { TRAINER_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

std::int64_t total_memory(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  return static_cast<std::int64_t>(p.totalGlobalMem);
}

std::mutex g_mutex;
std::vector<std::int64_t> g_limits;  // bytes per device, 0 = none; what memory_stats reports

}  // namespace

MemoryStats cuda_memory_stats(int device) {
  const auto s = device_stats(device);
  MemoryStats m;
  m.allocated = s.allocated_bytes[kAggregate].current;
  m.peak_allocated = s.allocated_bytes[kAggregate].peak;
  m.reserved = s.reserved_bytes[kAggregate].current;
  m.num_ooms = s.num_ooms;
  m.num_alloc_retries = s.num_alloc_retries;
  m.num_allocations = s.allocation[kAggregate].allocated;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (device < static_cast<int>(g_limits.size())) m.limit = g_limits[static_cast<std::size_t>(device)];
  return m;
}

void cuda_reset_peak(int device) { alloc::resetPeakStats(static_cast<c10::DeviceIndex>(device)); }

namespace {

/// Caps the caching allocator at `fraction` of the device and records `limit` bytes as the
/// budget memory_stats reports (0 = none).
void apply_fraction(int device, double fraction, std::int64_t limit) {
  alloc::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_limits.size() <= static_cast<std::size_t>(device)) g_limits.resize(static_cast<std::size_t>(device) + 1, 0);
  g_limits[static_cast<std::size_t>(device)] = limit;
}

}  // namespace

void cuda_set_fraction(int device, double fraction) {
  TRAINER_CHECK(fraction > 0.0 && fraction <= 1.0, "memory fraction ", fraction, " is outside (0, 1]");
  apply_fraction(device, fraction,
                 fraction >= 1.0 ? 0 : static_cast<std::int64_t>(fraction * static_cast<double>(total_memory(device))));
}

void cuda_set_limit(int device, std::int64_t bytes) {
  const std::int64_t total = total_memory(device);
  TRAINER_CHECK(bytes <= total, "memory limit ", bytes, " bytes exceeds cuda:", device, "'s ", total, " bytes");
  // The budget reported is the one asked for: bytes / total * total can come out a byte short.
  if (bytes <= 0) {
    apply_fraction(device, 1.0, 0);
  } else {
    apply_fraction(device, static_cast<double>(bytes) / static_cast<double>(total), bytes);
  }
}

void cuda_clear(int device, bool force) {
  if (force) check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  (void)device;  // the cache is emptied for every device: LibTorch offers no per-device call
  empty_cache();
}

std::vector<DeviceInfo> cuda_gpus(std::string* why) {
  std::vector<DeviceInfo> out;
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    return out;
  }
  if (n == 0 && why) *why = "no GPU visible";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.index = i;
    d.name = p.name;
    d.total = static_cast<std::int64_t>(p.totalGlobalMem);
    char bus[32];
    std::snprintf(bus, sizeof bus, "%08X:%02X:%02X.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
    d.pci_bus_id = bus;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace trainer::detail

namespace trainer::detail {

int cuda_compute_capability(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) return 0;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return 0;
  return p.major * 10 + p.minor;
}

}  // namespace trainer::detail

// --- Memory categories on CUDA ---------------------------------------------------------------
// A trace tracker attached to the caching allocator hears each allocation (ALLOC: address and
// the size asked for), each free (FREE_REQUESTED, when the bytes leave `allocated`), each segment
// and each refusal, on the allocating thread, under that device's allocator lock. The ledger
// keeps the live blocks with the category and phase of the thread that allocated them
// (current_memory_tag: the autograd engine's device threads, which run a CUDA backward, take the
// loop's). Nothing here calls back into the allocator while holding the ledger's lock: the lock
// order is always the allocator's, then the ledger's.
namespace trainer::detail {

namespace {

/// Leaked on purpose: the tracker cannot be detached, and CUDA memory is still freed during
/// static destruction.
BlockLedger& cuda_ledger() {
  static auto* ledger = new BlockLedger();
  return *ledger;
}
std::atomic<bool> g_cuda_tracked{false};
std::atomic<bool> g_cuda_attribute{true};
std::string g_cuda_why_not;

#ifdef TRAINER_CUDA_CATEGORIES
void on_cuda_trace(const alloc::TraceEntry& te) noexcept {
  using Entry = alloc::TraceEntry;
  try {
    const int device = static_cast<int>(te.device_);
    const auto address = static_cast<std::uintptr_t>(te.addr_);
    const auto bytes = static_cast<std::int64_t>(te.size_);
    switch (te.action_) {
      case Entry::ALLOC:
        if (g_cuda_attribute.load(std::memory_order_relaxed)) {
          cuda_ledger().allocated(device, address, caching_allocator_rounded(bytes), current_memory_tag());
        }
        return;
      case Entry::FREE_REQUESTED:
        cuda_ledger().freed(device, address);
        return;
      case Entry::SEGMENT_ALLOC:
      case Entry::SEGMENT_MAP:
        cuda_ledger().segment(device, bytes);
        return;
      case Entry::SEGMENT_FREE:
      case Entry::SEGMENT_UNMAP:
        cuda_ledger().segment(device, -bytes);
        return;
      case Entry::OOM:  // addr_ is the device's free memory, size_ the request as rounded
        // With categories off this run's blocks are not in the ledger: no refusal to report.
        if (g_cuda_attribute.load(std::memory_order_relaxed)) cuda_ledger().refused(device, bytes);
        return;
      default:
        return;
    }
  } catch (...) {
    // A tracker must not throw into the allocator: this event goes uncounted.
  }
}

/// Called after the refusal's trace, with the allocator's lock released: its own snapshot,
/// before the failed attempt's memory is freed.
void on_cuda_out_of_memory() noexcept {
  if (!cuda_ledger().refusal_wants_snapshot()) return;
  try {
    cuda_ledger().add_allocator_snapshot(torch::cuda::_memory_snapshot_pickled());
  } catch (...) {
    // Without memory for it, the categories' snapshot is written alone.
  }
}
#endif

}  // namespace

bool cuda_track_categories(int device, std::string* why) {
#ifndef TRAINER_CUDA_CATEGORIES
  (void)device;
  if (why) *why = "memory categories on CUDA need LibTorch 2.4 or later (this is " TORCH_VERSION ")";
  return false;
#else
  static std::once_flag once;
  std::call_once(once, [device] {
    try {
      // The allocator attaches a tracker to the devices it has set up: set it up first.
      (void)at::empty({1}, at::TensorOptions().device(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device))));
      int n = 0;
      check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
      std::vector<std::int64_t> reserved(static_cast<std::size_t>(n), 0);
      for (int d = 0; d < n; ++d)
        reserved[static_cast<std::size_t>(d)] = device_stats(d).reserved_bytes[kAggregate].current;
      cuda_ledger().reset(reserved);
      alloc::attachAllocatorTraceTracker([](const alloc::TraceEntry& te) { on_cuda_trace(te); });
      alloc::attachOutOfMemoryObserver(
          [](std::int64_t, std::size_t, std::size_t, std::size_t) { on_cuda_out_of_memory(); });
      g_cuda_tracked.store(true);
    } catch (const std::exception& e) {
      // cudaMallocAsync (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) refuses trackers.
      g_cuda_why_not = std::string("the CUDA allocator cannot report its allocations: ") + e.what();
    }
  });
  if (!g_cuda_tracked.load()) {
    if (why) *why = g_cuda_why_not;
    return false;
  }
  // cuBLAS keeps a workspace per handle (one per thread and device) for the process's life,
  // allocated by the first matrix product: on the loop's thread that would be the first forward,
  // and would count as activations ever after. A first product here makes it Other (workspace).
  // The autograd device thread's comes in the first backward, whose allocations count as Other.
  static std::mutex warm_mutex;
  static std::vector<int> warmed;
  std::lock_guard<std::mutex> lock(warm_mutex);
  if (std::find(warmed.begin(), warmed.end(), device) == warmed.end()) {
    warmed.push_back(device);
    try {
      MemoryTagScope other(MemoryCategory::Other, 0);
      const auto options = at::TensorOptions().device(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)));
      const at::Tensor a = at::ones({16, 16}, options);
      const at::Tensor bias = at::ones({16}, options);
      (void)at::mm(a, a);
      (void)at::addmm(bias, a, a);  // a linear layer's product: cuBLASLt's path, where LibTorch takes it
    } catch (const std::exception&) {
      // No room for the workspace now (a full GPU): the first forward makes it, and it counts
      // as activations. Nothing else depends on it.
    }
  }
  return true;
#endif
}

bool cuda_categories_tracked() { return g_cuda_tracked.load(); }

void cuda_set_categories(bool on) { g_cuda_attribute.store(on); }

bool cuda_categories_on() { return g_cuda_tracked.load() && g_cuda_attribute.load(); }

MemoryBreakdown cuda_breakdown(int device) {
  const std::int64_t reserved = device_stats(device).reserved_bytes[kAggregate].current;  // before the ledger's lock
  MemoryBreakdown out = cuda_ledger().breakdown(device);
  out.reserved = std::max(reserved, out.allocated);
  return out;
}

MemoryBreakdown cuda_peak_breakdown(int device) { return cuda_ledger().peak(device); }

void cuda_reset_peak_breakdown(int device) { cuda_ledger().reset_peak(device); }

bool cuda_attribute(const at::Tensor& tensor, MemoryCategory category) {
  if (!tensor.defined() || !tensor.has_storage() || !tensor.device().is_cuda()) return false;
  const auto address = reinterpret_cast<std::uintptr_t>(tensor.storage().data_ptr().get());
  return cuda_ledger().attribute(tensor.device().index(), address, category);
}

MemoryBreakdown cuda_live(int device, std::vector<LiveBlock>& blocks, std::int64_t& left_out) {
  const std::int64_t reserved = device_stats(device).reserved_bytes[kAggregate].current;
  MemoryBreakdown out = cuda_ledger().live(device, blocks, left_out);
  out.reserved = std::max(reserved, out.allocated);
  return out;
}

std::uint64_t cuda_refusal_mark() { return cuda_ledger().refusal_mark(); }

RefusalPtr cuda_take_refusal(std::uint64_t mark) { return cuda_ledger().take_refusal(mark); }

}  // namespace trainer::detail
