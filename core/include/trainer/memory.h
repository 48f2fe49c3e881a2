#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <string>

#include "trainer/export.h"

namespace trainer {

/// Memory counters of one device, in bytes. On CPU they come from trainer's tracking
/// allocator (installed by install_cpu_tracking_allocator); on CUDA from LibTorch's caching
/// allocator, in builds against a LibTorch with CUDA (has_memory_backend). Functions below
/// throw trainer::Error for a device without a backend in this build.
struct MemoryStats {
  std::int64_t allocated = 0;            ///< bytes held by live tensors
  std::int64_t reserved = 0;             ///< bytes obtained from the system (CPU: allocated + headers)
  std::int64_t peak_allocated = 0;       ///< highest `allocated` since the last reset_peak_memory
  std::int64_t num_ooms = 0;             ///< allocations refused (budget or device)
  std::int64_t num_alloc_retries = 0;    ///< CUDA: cudaMalloc retries after freeing cache; CPU: 0
  std::int64_t limit = 0;                ///< the budget in bytes; 0 = none
  std::int64_t last_failed_request = 0;  ///< size of the last refused allocation
  std::int64_t num_allocations = 0;      ///< allocations served since the process started
};

/// Installs the CPU tracking allocator (c10::SetCPUAllocator) once per process. Tensors
/// allocated before keep their old deleter; everything after is counted. Idempotent.
TRAINER_API void install_cpu_tracking_allocator();

/// Current counters of `device` (CPU: zeros until the tracking allocator is installed).
TRAINER_API MemoryStats memory_stats(const c10::Device& device);

/// Starts a new peak window: peak_allocated = allocated.
TRAINER_API void reset_peak_memory(const c10::Device& device);

/// Caps usable memory of `device` at `bytes` (0 = no cap). On CPU an allocation that would
/// take `allocated` past the cap throws c10::OutOfMemoryError ("CPU out of memory: tried to
/// allocate X; Y in use; Z budget"), a real OOM from a real allocation.
TRAINER_API void set_memory_limit(const c10::Device& device, std::int64_t bytes);

/// Caps usable memory of `device` at `fraction` of its total (CUDA: the caching allocator's
/// per-process fraction; CPU: of the host's MemTotal). UsageError outside (0, 1].
TRAINER_API void set_memory_fraction(const c10::Device& device, double fraction);

/// True when this build can account for, cap and clear memory of `device`'s type.
TRAINER_API bool has_memory_backend(const c10::Device& device);

/// Gives cached memory back: CPU returns freed heap pages to the OS (malloc_trim) when
/// `force`; CUDA empties the caching allocator's cache (emptyCache). Safe to call at any
/// time; a no-op on devices without a memory backend in this build.
TRAINER_API void clear_memory(const c10::Device& device, bool force = false);

/// True for c10::OutOfMemoryError, and — as a fallback for CUDA library errors that arrive
/// as plain c10::Error — for messages that say "out of memory".
TRAINER_API bool is_out_of_memory(const std::exception& e);

/// Bytes in a human unit: "512 B", "3.00 KiB", "12.5 MiB", "125 MiB".
TRAINER_API std::string format_bytes(std::int64_t bytes);

/// Memory of the host and of this process, from /proc (bytes; 0 when unreadable).
struct HostMemory {
  std::int64_t total = 0;             ///< MemTotal
  std::int64_t available = 0;         ///< MemAvailable
  std::int64_t process_rss = 0;       ///< VmRSS of this process
  std::int64_t process_peak_rss = 0;  ///< VmHWM of this process
};

/// Reads /proc/meminfo and /proc/self/status.
TRAINER_API HostMemory host_memory();

/// Reports the allocation delta and peak of a region of code on one device.
class TRAINER_API MemoryMonitor {
 public:
  /// Starts the region: remembers `allocated` and starts a new peak window.
  explicit MemoryMonitor(const c10::Device& device);
  /// allocated now - allocated at the start.
  std::int64_t delta() const;
  /// peak allocated since the start - allocated at the start.
  std::int64_t peak_delta() const;

 private:
  c10::Device device_;
  std::int64_t start_;
};

}  // namespace trainer
