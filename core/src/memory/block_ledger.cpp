#include "memory/block_ledger.h"

#include <algorithm>
#include <new>
#include <utility>

namespace trainer::detail {

namespace {

MemoryBreakdown ledger_breakdown(const std::array<std::int64_t, kMemoryCategoryCount>& bytes) {
  MemoryBreakdown out;
  out.bytes = bytes;
  for (const std::int64_t b : bytes) out.allocated += b;
  return out;
}

}  // namespace

std::int64_t caching_allocator_rounded(std::int64_t bytes) {
  constexpr std::int64_t kMin = 512;
  return bytes < kMin ? kMin : (bytes + kMin - 1) / kMin * kMin;
}

BlockLedger::Device* BlockLedger::device(int index) {
  return index >= 0 && static_cast<std::size_t>(index) < devices_.size() ? &devices_[static_cast<std::size_t>(index)]
                                                                         : nullptr;
}

const BlockLedger::Device* BlockLedger::device(int index) const {
  return index >= 0 && static_cast<std::size_t>(index) < devices_.size() ? &devices_[static_cast<std::size_t>(index)]
                                                                         : nullptr;
}

void BlockLedger::reset(const std::vector<std::int64_t>& reserved) {
  std::lock_guard<std::mutex> lock(mutex_);
  devices_.assign(reserved.size(), Device{});
  for (std::size_t d = 0; d < reserved.size(); ++d) devices_[d].reserved = reserved[d];
  refusal_.reset();
}

void BlockLedger::allocated(int index, std::uintptr_t address, std::int64_t bytes, MemoryTag tag) {
  const std::uint8_t category = tag.category < kMemoryCategoryCount ? tag.category : 0;  // Other
  std::lock_guard<std::mutex> lock(mutex_);
  Device* d = device(index);
  if (d == nullptr) return;
  auto [it, fresh] = d->blocks.try_emplace(address, Block{bytes, 0, category, tag.phase});
  if (!fresh) {  // a free the ledger missed: the address was handed out again
    d->bytes[it->second.category] -= it->second.bytes;
    d->total -= it->second.bytes;
    it->second = Block{bytes, 0, category, tag.phase};
  }
  it->second.serial = ++serial_;
  d->bytes[category] += bytes;
  d->total += bytes;
  if (d->total > d->peak_total) {
    d->peak_total = d->total;
    d->peak_bytes = d->bytes;
  }
}

void BlockLedger::freed(int index, std::uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  Device* d = device(index);
  if (d == nullptr) return;
  const auto it = d->blocks.find(address);
  if (it == d->blocks.end()) return;
  d->bytes[it->second.category] -= it->second.bytes;
  d->total -= it->second.bytes;
  d->blocks.erase(it);
}

void BlockLedger::segment(int index, std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Device* d = device(index)) d->reserved += bytes;
}

std::vector<LiveBlock> BlockLedger::list(const Device& d, std::int64_t& left_out, std::int64_t max_blocks) const {
  std::vector<LiveBlock> out;
  out.reserve(d.blocks.size());
  for (const auto& [address, b] : d.blocks) {
    out.push_back({address, b.bytes, b.serial, static_cast<MemoryCategory>(b.category), b.phase});
  }
  std::sort(out.begin(), out.end(), [](const LiveBlock& a, const LiveBlock& b) { return a.serial < b.serial; });
  left_out = 0;
  const auto keep = static_cast<std::size_t>(std::max<std::int64_t>(max_blocks, 0));
  if (out.size() > keep) {
    left_out = static_cast<std::int64_t>(out.size() - keep);
    out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(keep));  // the newest stay: the step's own
  }
  return out;
}

void BlockLedger::refused(int index, std::int64_t bytes) {
  auto r = std::make_shared<Refusal>();
  r->requested = bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  const Device* d = device(index);
  if (d == nullptr) return;
  r->live = ledger_breakdown(d->bytes);
  r->live.reserved = std::max(d->reserved, r->live.allocated);
  try {
    r->blocks = list(*d, r->blocks_left_out, kMaxListedBlocks);
  } catch (const std::bad_alloc&) {
    r->blocks.clear();
    r->blocks_left_out = static_cast<std::int64_t>(d->blocks.size());
  }
  r->sequence = ++refusals_;
  refusal_ = std::move(r);
}

bool BlockLedger::refusal_wants_snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refusal_ && refusal_->allocator_pickle.empty();
}

void BlockLedger::add_allocator_snapshot(std::string pickled) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (refusal_ && refusal_->allocator_pickle.empty()) refusal_->allocator_pickle = std::move(pickled);
}

MemoryBreakdown BlockLedger::breakdown(int index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Device* d = device(index);
  if (d == nullptr) return {};
  MemoryBreakdown out = ledger_breakdown(d->bytes);
  out.reserved = std::max(d->reserved, out.allocated);
  return out;
}

MemoryBreakdown BlockLedger::peak(int index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Device* d = device(index);
  if (d == nullptr) return {};
  MemoryBreakdown out = ledger_breakdown(d->peak_bytes);
  out.reserved = out.allocated;
  return out;
}

void BlockLedger::reset_peak(int index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Device* d = device(index)) {
    d->peak_total = d->total;
    d->peak_bytes = d->bytes;
  }
}

bool BlockLedger::attribute(int index, std::uintptr_t address, MemoryCategory category) {
  const auto to = static_cast<std::uint8_t>(category);
  if (to >= kMemoryCategoryCount) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  Device* d = device(index);
  if (d == nullptr) return false;
  const auto it = d->blocks.find(address);
  if (it == d->blocks.end()) return false;
  d->bytes[it->second.category] -= it->second.bytes;
  d->bytes[to] += it->second.bytes;
  it->second.category = to;
  return true;
}

MemoryBreakdown BlockLedger::live(int index, std::vector<LiveBlock>& blocks, std::int64_t& left_out,
                                  std::int64_t max_blocks) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Device* d = device(index);
  blocks.clear();
  left_out = 0;
  if (d == nullptr) return {};
  blocks = list(*d, left_out, max_blocks);
  MemoryBreakdown out = ledger_breakdown(d->bytes);
  out.reserved = std::max(d->reserved, out.allocated);
  return out;
}

std::uint64_t BlockLedger::refusal_mark() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refusals_;
}

RefusalPtr BlockLedger::take_refusal(std::uint64_t mark) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!refusal_ || refusal_->sequence <= mark) return nullptr;
  return std::move(refusal_);
}

}  // namespace trainer::detail
