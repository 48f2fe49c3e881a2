// The CUDA memory backend: compiled only when the LibTorch found has CUDA (core/CMakeLists.txt
// defines TRAINER_WITH_CUDA then). Everything CUDA-specific in trainer is here; the API
// differences between LibTorch 1.13 and 2.x are absorbed in the small shim below.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <mutex>
#include <vector>

#include "memory/backend.h"
#include "trainer/error.h"

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
