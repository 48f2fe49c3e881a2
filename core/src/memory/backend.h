#pragma once
// Per-device memory backends behind trainer/memory.h. The CPU backend (cpu_allocator.cpp)
// is always built; the CUDA backend (cuda/cuda_backend.cpp) only against a LibTorch with
// CUDA, which defines TRAINER_WITH_CUDA for the core.
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/devices.h"
#include "trainer/memory.h"

namespace trainer::detail {

MemoryStats cpu_memory_stats();
void cpu_reset_peak();
void cpu_set_limit(std::int64_t bytes);
void cpu_clear(bool force);

#ifdef TRAINER_WITH_CUDA
/// Caching-allocator counters of one GPU (LibTorch index).
MemoryStats cuda_memory_stats(int device);
void cuda_reset_peak(int device);
/// Caps the caching allocator at `bytes` of the GPU (setMemoryFraction of its total); 0 lifts it.
void cuda_set_limit(int device, std::int64_t bytes);
/// Caps the caching allocator at `fraction` of the GPU's total memory (0 < fraction <= 1).
void cuda_set_fraction(int device, double fraction);
/// Returns cached blocks to the driver (emptyCache); `force` also synchronises first.
void cuda_clear(int device, bool force);
/// The GPUs the CUDA runtime exposes (already filtered by CUDA_VISIBLE_DEVICES), without
/// creating a context on them: name, total memory, PCI bus id; free memory unknown (-1).
/// `why` receives the CUDA runtime's error when it reports no GPU.
std::vector<DeviceInfo> cuda_gpus(std::string* why);
/// Compute capability of GPU `device` as major*10+minor; 0 when it is not there.
int cuda_compute_capability(int device);
#endif

}  // namespace trainer::detail
