#pragma once
// What was live on a device at one moment, allocation by allocation: the core takes one at
// every out-of-memory error in the loop (RUN_DIR/memory/oom-*.json and .pickle), a plugin
// whenever it wants one. Each live block with the category and the phase of the run that
// allocated it (memory categories on, the default): on the CPU each block of the tracking
// allocator; on CUDA each allocation the caching allocator made since the run began following
// it (LibTorch 2.4 or later), at its rounded size, without the allocator's overhead.
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/export.h"
#include "trainer/memory.h"

namespace trainer {

/// One live allocation.
struct MemoryBlockInfo {
  std::uint64_t address = 0;
  std::int64_t size = 0;
  std::uint64_t serial = 0;  ///< the process's allocation number, from 1: lower is older
  MemoryCategory category = MemoryCategory::Other;
  std::string phase;  ///< the loop's phase that allocated it ("data", "forward" …); "" outside them
};

/// The live memory of a device at one moment.
struct MemorySnapshot {
  std::string device;    ///< "cpu", "cuda:0" …
  std::string reason;    ///< why it was taken: the out-of-memory error's message, or the requester's words
  MemoryBreakdown live;  ///< by category (the refused request not among it)
  std::vector<MemoryBlockInfo> blocks;  ///< every live block, oldest first
  std::int64_t blocks_left_out = 0;     ///< live blocks not listed (past 200,000)
  std::int64_t requested = 0;           ///< the refused allocation; 0 when taken on request
  std::int64_t limit = 0;               ///< the budget then; 0 = none
  std::int64_t block_overhead = 0;      ///< bytes the allocator reserves beside each block (CPU: 64; CUDA: 0)
  // Where the run was (the core fills these in; -1 / "" when unknown).
  std::int64_t step = -1;         ///< optimizer steps completed
  std::int64_t epoch = -1;        ///< 0-based
  std::int64_t micro_batch = -1;  ///< of the failed attempt
  std::int64_t attempt = -1;      ///< 0-based, of the failed batch
  std::string phase;              ///< where it failed ("forward" …)
};

/// Blocks a snapshot's pickle holds at most (write_memory_snapshot).
inline constexpr std::size_t kMaxPickledBlocks = 20000;

/// What is live on `device` now. Throws trainer::Error where has_memory_categories(device) is false.
TRAINER_API MemorySnapshot memory_snapshot(const c10::Device& device, const std::string& reason);

/// Writes `<path_prefix>.json` (atomically): the snapshot's device, reason, where the run was,
/// the request and the budget, the categories, and its `largest` blocks, largest first; and
/// `<path_prefix>.pickle`: the listed blocks (the kMaxPickledBlocks largest of more; about
/// 1 KB each) in the format of PyTorch's
/// torch.cuda.memory._dump_snapshot (a dict of "segments" and "device_traces"), which
/// pytorch.org/memory_viz and torch.cuda._memory_viz read. Each block is a segment of its own
/// (the allocator's overhead in front of it, then the block); its frames name its category and
/// phase; the trace allocates every listed block oldest first (the blocks freed in between are
/// not recorded), each with its category, then, after an out-of-memory error, the refused request.
TRAINER_API void write_memory_snapshot(const MemorySnapshot& snapshot, const std::string& path_prefix,
                                       std::size_t largest = 50);

}  // namespace trainer
