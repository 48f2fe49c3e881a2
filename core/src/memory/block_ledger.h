#pragma once
// The live blocks of the devices an allocator's trace reports (CUDA's caching allocator: each
// allocation, free, segment and refusal), each with the category and phase it counts as, so that
// the live bytes split into categories as the CPU's tracking allocator splits its own. Free of
// any CUDA type: the CUDA backend translates the allocator's trace into these calls, and the
// bookkeeping is tested on every machine.
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/backend.h"

namespace trainer::detail {

/// A request of `bytes` as CUDA's caching allocator rounds it: up to a multiple of 512 bytes,
/// at least 512 (its kMinBlockSize).
std::int64_t caching_allocator_rounded(std::int64_t bytes);

class BlockLedger {
 public:
  /// Forgets everything: `reserved[d]` is device d's reserved bytes now (segments from then on
  /// are counted from it).
  void reset(const std::vector<std::int64_t>& reserved);

  /// Block `address` of `bytes` (as counted: rounded) is live on `device`, counted as `tag`.
  void allocated(int device, std::uintptr_t address, std::int64_t bytes, MemoryTag tag);
  /// Block `address` was freed; one the ledger never saw is ignored.
  void freed(int device, std::uintptr_t address);
  /// The allocator took `bytes` more from the device (negative: gave them back).
  void segment(int device, std::int64_t bytes);
  /// A request of `bytes` was refused: what is live now becomes the last refusal.
  void refused(int device, std::int64_t bytes);
  /// Adds the allocator's own snapshot to the last refusal, when it has none yet.
  void add_allocator_snapshot(std::string pickled);
  /// Whether the last refusal, not yet taken, lacks the allocator's snapshot.
  bool refusal_wants_snapshot() const;

  /// The live bytes by category (`allocated`: their sum; `reserved`: the segments counted).
  MemoryBreakdown breakdown(int device) const;
  /// The breakdown at the highest sum since reset_peak.
  MemoryBreakdown peak(int device) const;
  void reset_peak(int device);
  /// Counts block `address` as `category` from now on; false when the ledger has no such block.
  bool attribute(int device, std::uintptr_t address, MemoryCategory category);
  /// The breakdown and the live blocks, oldest first: at most `max_blocks` (the newest), the
  /// rest counted in `left_out`.
  MemoryBreakdown live(int device, std::vector<LiveBlock>& blocks, std::int64_t& left_out,
                       std::int64_t max_blocks = kMaxListedBlocks) const;

  /// The number of refusals so far.
  std::uint64_t refusal_mark() const;
  /// The last refusal if it came after `mark` and was not taken yet; once.
  RefusalPtr take_refusal(std::uint64_t mark);

 private:
  struct Block {
    std::int64_t bytes;
    std::uint64_t serial;
    std::uint8_t category;
    std::uint8_t phase;
  };
  struct Device {
    std::unordered_map<std::uintptr_t, Block> blocks;
    std::array<std::int64_t, kMemoryCategoryCount> bytes{};
    std::int64_t total = 0;
    std::int64_t reserved = 0;
    std::array<std::int64_t, kMemoryCategoryCount> peak_bytes{};
    std::int64_t peak_total = 0;
  };
  Device* device(int index);
  const Device* device(int index) const;
  std::vector<LiveBlock> list(const Device& d, std::int64_t& left_out, std::int64_t max_blocks) const;

  mutable std::mutex mutex_;
  std::vector<Device> devices_;
  std::uint64_t serial_ = 0;
  std::uint64_t refusals_ = 0;
  std::shared_ptr<Refusal> refusal_;  ///< the last one, until taken
};

}  // namespace trainer::detail
