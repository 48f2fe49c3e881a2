#pragma once
// Per-device memory backends behind trainer/memory.h. The CPU backend (cpu_allocator.cpp)
// is always built; the CUDA backend (cuda/cuda_backend.cpp) only against a LibTorch with
// CUDA, which defines TRAINER_WITH_CUDA for the core.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/devices.h"
#include "trainer/export.h"
#include "trainer/memory.h"
#include "trainer/memory_snapshot.h"

namespace at {
class Tensor;
}

namespace trainer::detail {

MemoryStats cpu_memory_stats();
void cpu_reset_peak();
void cpu_set_limit(std::int64_t bytes);
void cpu_clear(bool force);

/// The category this thread's CPU allocations count as (MemoryCategoryScope sets it too).
void set_thread_memory_category(MemoryCategory category);

/// Live bytes by category; they sum to allocated (blocks allocated while categories were off
/// count as Other), but for blocks other threads are allocating at that instant.
MemoryBreakdown cpu_breakdown();
/// The breakdown at the highest allocated since cpu_reset_peak_breakdown().
MemoryBreakdown cpu_peak_breakdown();
void cpu_reset_peak_breakdown();
/// Whether blocks are being listed with their category (the allocator installed, categories on).
bool cpu_categories_on();
void cpu_set_categories(bool on);
/// Counts the storage of `tensor` as `category` (in range: attribute_memory checks) from now on;
/// false when it is not a listed
/// block of the tracking allocator (another allocator's, from_blob, allocated with categories off).
bool cpu_attribute(const at::Tensor& tensor, MemoryCategory category);

/// One live block of the tracking allocator.
struct LiveBlock {
  std::uintptr_t address;  ///< of its data
  std::int64_t size;
  std::uint64_t serial;  ///< allocation number in the process, from 1
  MemoryCategory category;
  std::uint8_t phase;  ///< the allocating thread's phase code (0: none)
};

/// Bytes the CPU tracking allocator keeps in front of each block (its header): reserved is
/// allocated plus this per live block.
inline constexpr std::int64_t kCpuBlockHeader = 64;

/// Blocks a listing copies at most (32 bytes each); the rest are counted.
inline constexpr std::int64_t kMaxListedBlocks = 200000;

/// What was live when an allocation was refused.
struct Refusal {
  MemoryBreakdown live;  ///< the live bytes by category, the refused request not among them
  std::int64_t requested = 0;
  std::vector<LiveBlock> blocks;     ///< the live blocks then, oldest first
  std::int64_t blocks_left_out = 0;  ///< past kMaxListedBlocks, or not copied (no memory)
  std::uint64_t sequence = 0;        ///< the process's refusals counted, from 1
  /// CUDA: the caching allocator's own snapshot at the refusal, as
  /// torch.cuda.memory._snapshot() pickles it (its out-of-memory observer takes it); "" when none.
  std::string allocator_pickle;
};
/// A refusal as it is kept and handed between threads (moving it allocates nothing).
using RefusalPtr = std::shared_ptr<const Refusal>;

/// The sequence number of the process's last refusal (0: none yet).
TRAINER_API std::uint64_t cpu_refusal_mark();
/// This thread's own last refusal, else the process's last one if it came after `mark` and its
/// thread did not take it (an error thrown on another thread, an intra-op worker's, and
/// rethrown here); once. Null when none (or categories were off). Exported for the tests, as
/// the two beside it.
TRAINER_API RefusalPtr cpu_take_refusal(std::uint64_t mark = UINT64_MAX);
/// Makes `refusal` this thread's own: a loader worker's, handed over with its error.
TRAINER_API void cpu_keep_refusal(RefusalPtr refusal);

/// The live bytes by category and every listed live block, oldest first, at one instant
/// (`blocks` gets at most kMaxListedBlocks; `left_out` the rest's count).
MemoryBreakdown cpu_live(std::vector<LiveBlock>& blocks, std::int64_t& left_out);

/// The blocks of a listing as the public snapshot shows them (phase codes named).
std::vector<MemoryBlockInfo> blocks_of(const std::vector<LiveBlock>& live);

/// A code for what this thread is doing, kept with each block it allocates: the core's
/// OomPhase + 1, 0 outside the loop's phases.
void set_thread_memory_phase(std::uint8_t code);

/// Starts following `device`'s allocations by category where that takes a step of its own (a
/// GPU's caching allocator: cuda_track_categories); true at once for the CPU. False with the
/// reason in `why` where this build or allocator cannot.
bool track_memory_categories(const c10::Device& device, std::string* why);

/// A category and a phase code, as a block is tagged with them.
struct MemoryTag {
  std::uint8_t category;
  std::uint8_t phase;
};
/// What the loop is doing (OomRecovery::enter): the tag of the allocations of threads that never
/// set their own, such as the autograd engine's device threads, which run a CUDA backward.
TRAINER_API void set_run_memory_tag(MemoryCategory category, std::uint8_t phase);
/// This thread's category and phase code; the run's (set_run_memory_tag) on a thread that never
/// set its own. Both exported for the tests.
TRAINER_API MemoryTag current_memory_tag();

/// This thread's category and phase code for the scope's lifetime; the previous ones after.
class MemoryTagScope {
 public:
  MemoryTagScope(MemoryCategory category, std::uint8_t phase);
  ~MemoryTagScope();
  MemoryTagScope(const MemoryTagScope&) = delete;
  MemoryTagScope& operator=(const MemoryTagScope&) = delete;

 private:
  std::uint8_t category_, phase_;
  bool tagged_;
};

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

/// Starts splitting the caching allocator's live bytes into categories (once per process: it
/// attaches a trace tracker and an out-of-memory observer to the allocator, which cannot be
/// detached). False with the reason in `why` where this LibTorch or allocator backend cannot.
/// `device`: the GPU whose allocator is set up first (the run's).
bool cuda_track_categories(int device, std::string* why);
/// Whether cuda_track_categories succeeded.
bool cuda_categories_tracked();
/// Whether allocations are attributed (set_memory_categories; frees are always followed).
void cuda_set_categories(bool on);
/// Tracked and attributing: has_memory_categories on CUDA.
bool cuda_categories_on();
/// Live bytes of GPU `device` by category: each allocation counted at the caching allocator's
/// rounding of its request (512 bytes); `reserved` the allocator's. The few bytes a block
/// handed out whole holds past that rounding count as slack.
MemoryBreakdown cuda_breakdown(int device);
MemoryBreakdown cuda_peak_breakdown(int device);
void cuda_reset_peak_breakdown(int device);
/// Counts the block of `tensor` (a CUDA tensor) as `category` from now on.
bool cuda_attribute(const at::Tensor& tensor, MemoryCategory category);
/// The categories and the listed live blocks of GPU `device`, oldest first.
MemoryBreakdown cuda_live(int device, std::vector<LiveBlock>& blocks, std::int64_t& left_out);
/// As cpu_refusal_mark / cpu_take_refusal, for the caching allocator's refusals (an autograd
/// device thread's among them, which the engine rethrows on the loop's thread).
std::uint64_t cuda_refusal_mark();
RefusalPtr cuda_take_refusal(std::uint64_t mark);
#endif

}  // namespace trainer::detail
