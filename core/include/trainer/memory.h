#pragma once
#include <c10/core/Device.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include "trainer/export.h"

namespace at {
class Tensor;
}

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

/// What a live byte on a device is for. Each block of the CPU tracking allocator counts as the
/// category of the thread that allocated it (the core sets it by phase: the batch is read as
/// Batch, the forward allocates Activations, an evaluation Evaluation, loading the data sets
/// Dataset, building the model Parameters; anything else, the backward's and the optimizer
/// step's temporaries included, is Other), and the core re-attributes what it knows by
/// identity at the step's boundaries: parameters and buffers, gradients, optimizer state.
enum class MemoryCategory : std::uint8_t {
  Other = 0,       ///< workspace and temporaries, and whatever nothing else claims
  Parameters,      ///< parameters and buffers of the model
  Gradients,       ///< parameters' .grad
  OptimizerState,  ///< the optimizer's per-parameter state (AdamW's moments, SGD's momentum)
  Activations,     ///< allocated in the forward and still live: what it keeps for the backward
  Batch,           ///< the batch being trained, as read from the dataset
  Evaluation,      ///< allocated during an evaluation
  Dataset,         ///< data sets held in memory (on the CPU, the device is the host)
};
inline constexpr std::size_t kMemoryCategoryCount = 8;

/// "other", "parameters", "gradients", "optimizer_state", "activations", "batch",
/// "evaluation", "dataset": the names in memory.jsonl and the memory/<name>_mb metrics.
TRAINER_API const char* memory_category_name(MemoryCategory category);
/// The category named `name` (memory_category_name's), or nullopt.
TRAINER_API std::optional<MemoryCategory> memory_category_named(std::string_view name);

/// Live bytes of a device by category.
struct MemoryBreakdown {
  std::array<std::int64_t, kMemoryCategoryCount> bytes{};  ///< indexed by MemoryCategory
  /// The sum of bytes: memory_stats().allocated at the same moment, less the blocks other threads
  /// are allocating at that instant (they join their category a moment later).
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;  ///< what the allocator holds for them (CPU: + 64 B of header per block)

  std::int64_t operator[](MemoryCategory c) const { return bytes[static_cast<std::size_t>(c)]; }
  /// reserved - allocated: the allocator's slack.
  std::int64_t slack() const { return reserved - allocated; }
  /// The category holding the most bytes (the first of equals in enum order).
  TRAINER_API MemoryCategory largest() const;
};

/// "activations 61 % of 94.7 MiB": the largest category, its share and the total.
TRAINER_API std::string largest_category_text(const MemoryBreakdown& breakdown);

/// True when `device`'s live memory can be split into categories now: CPU with the tracking
/// allocator installed and categories on (set_memory_categories); a GPU once a run on it with
/// categories on has started following its caching allocator (LibTorch 2.4 or later).
TRAINER_API bool has_memory_categories(const c10::Device& device);
/// Turns the attribution of blocks to categories on or off (on by default). CPU blocks
/// allocated while it is off count as Other for as long as they live; GPU blocks are not counted.
TRAINER_API void set_memory_categories(bool on);
/// Live bytes of `device` by category. CPU: exact, every byte of `allocated` in one category.
/// CUDA: each allocation at the caching allocator's default rounding of its request (512
/// bytes); the bytes past that in a block the allocator hands out whole (up to 1 MiB by
/// default, more with max_split_size_mb or roundup_power2_divisions) are in the slack.
/// Throws trainer::Error where has_memory_categories is false.
TRAINER_API MemoryBreakdown memory_breakdown(const c10::Device& device);
/// The breakdown at the moment `allocated` was highest since the last
/// reset_peak_breakdown(device) (a window of its own, apart from reset_peak_memory's); its
/// `reserved` is its `allocated`.
TRAINER_API MemoryBreakdown peak_memory_breakdown(const c10::Device& device);
TRAINER_API void reset_peak_breakdown(const c10::Device& device);
/// Counts the memory of `tensor` (its whole storage) as `category` from now on. Returns false
/// when its memory is not attributed (another device, not from the tracking allocator,
/// allocated while categories were off).
TRAINER_API bool attribute_memory(const at::Tensor& tensor, MemoryCategory category);

/// While it lives, this thread's allocations count as `category`; then the previous one again.
class TRAINER_API MemoryCategoryScope {
 public:
  explicit MemoryCategoryScope(MemoryCategory category);
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

 private:
  MemoryCategory previous_;
  bool had_own_;  ///< the thread had a category of its own before (else it takes the run's again after)
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
