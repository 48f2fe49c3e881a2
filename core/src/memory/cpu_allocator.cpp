// The CPU tracking allocator: counts every byte LibTorch allocates on CPU, enforces the
// memory budget (memory.limit_mb) by refusing allocations with c10::OutOfMemoryError, and —
// with memory categories on — keeps every live block in a list with the category it counts
// as, so that the live bytes split into categories (memory_breakdown): exactly, but for the
// blocks other threads are allocating at that instant, counted from their next reading on.
#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "memory/backend.h"
#include "trainer/error.h"
#include "trainer/memory.h"
#include "util/torch_compat.h"

namespace trainer {
namespace {

using detail::kMaxListedBlocks;
using detail::LiveBlock;

// NOTE: each block carries a 64-byte header in front of its data, so the deleter finds the
// block from the data pointer alone; the data stays 64-byte aligned like c10's own allocator.
// oneDNN's convolution asserts DataPtr context == data pointer, hence no separate context.
constexpr std::size_t kHeader = detail::kCpuBlockHeader;

struct TrackedBlock {
  std::int64_t size;   ///< bytes asked for (the storage's nbytes)
  TrackedBlock* prev;  ///< the live list, when linked
  TrackedBlock* next;
  std::uint64_t serial;   ///< which allocation of the process this is (from 1)
  std::uint8_t category;  ///< MemoryCategory it counts as, when linked
  std::uint8_t phase;     ///< the allocating thread's phase code (set_thread_memory_phase)
  bool linked;            ///< in the live list (allocated while categories were on)
};
static_assert(sizeof(TrackedBlock) <= kHeader, "the block header must fit in front of the data");

constexpr std::size_t kCategories = kMemoryCategoryCount;

std::atomic<std::int64_t> g_allocated{0};
std::atomic<std::int64_t> g_blocks{0};
std::atomic<std::int64_t> g_peak{0};
std::atomic<std::int64_t> g_limit{0};
std::atomic<std::int64_t> g_ooms{0};
std::atomic<std::int64_t> g_last_failed{0};
std::atomic<std::int64_t> g_total_allocs{0};
std::atomic<bool> g_installed{false};
std::atomic<bool> g_categories{true};

// The live list and the category counters, under g_list_mutex. Blocks allocated while
// categories were off are not in the list; their bytes (g_unlinked_bytes) count as Other. The
// bytes of a block being allocated are in g_allocated (reserved against the budget) before
// they are in either: the breakdown sums what is linked or unlinked, never a block in flight.
std::mutex g_list_mutex;
TrackedBlock g_list{0, &g_list, &g_list, 0, 0, 0, false};  // sentinel of the circular live list
std::array<std::int64_t, kCategories> g_category_bytes{};
std::int64_t g_linked_bytes = 0;
std::int64_t g_linked_count = 0;
std::atomic<std::int64_t> g_unlinked_bytes{0};
std::int64_t g_window_peak = 0;  ///< highest allocated since reset_peak_breakdown
std::array<std::int64_t, kCategories> g_window_peak_bytes{};
std::int64_t g_window_peak_unlinked = 0;

thread_local std::uint8_t t_category = 0;  // MemoryCategory::Other
thread_local std::uint8_t t_phase = 0;     // outside the loop's phases
thread_local bool t_tagged = false;        // either was ever set on this thread
// The loop's category (high byte) and phase (low byte), set_run_memory_tag's, for threads that
// never set their own: one word, so that a reader never sees one without the other.
std::atomic<std::uint16_t> g_run_tag{0};
// What was live when this thread's last allocation was refused, until taken (by the core's
// out-of-memory recovery: by then the failed attempt's memory is gone). One per thread: a
// loader worker's refusal is its own, handed over with its error. The process's last one is
// also kept (under g_list_mutex) for an error that another thread rethrows.
thread_local detail::RefusalPtr t_refusal;
detail::RefusalPtr g_last_refusal;
std::uint64_t g_refusals = 0;

void bump_peak(std::int64_t now) {
  std::int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

TrackedBlock* block_of(void* data) { return reinterpret_cast<TrackedBlock*>(static_cast<char*>(data) - kHeader); }

void tracked_free(void* data) {
  if (!data) return;
  TrackedBlock* b = block_of(data);
  const std::int64_t size = b->size;
  if (b->linked) {
    std::lock_guard<std::mutex> lock(g_list_mutex);
    b->prev->next = b->next;
    b->next->prev = b->prev;
    g_category_bytes[b->category] -= size;
    g_linked_bytes -= size;
    --g_linked_count;
    g_allocated.fetch_sub(size, std::memory_order_relaxed);
  } else {
    g_unlinked_bytes.fetch_sub(size, std::memory_order_relaxed);
    g_allocated.fetch_sub(size, std::memory_order_relaxed);
  }
  g_blocks.fetch_sub(1, std::memory_order_relaxed);
  std::free(b);
}

void link(TrackedBlock* b) {
  std::lock_guard<std::mutex> lock(g_list_mutex);
  b->linked = true;
  b->category = t_category;
  b->phase = t_phase;
  b->next = &g_list;
  b->prev = g_list.prev;
  g_list.prev->next = b;
  g_list.prev = b;
  g_category_bytes[b->category] += b->size;
  g_linked_bytes += b->size;
  ++g_linked_count;
  const std::int64_t unlinked = g_unlinked_bytes.load(std::memory_order_relaxed);
  const std::int64_t now = g_linked_bytes + unlinked;
  if (now > g_window_peak) {
    g_window_peak = now;
    g_window_peak_bytes = g_category_bytes;
    g_window_peak_unlinked = unlinked;
  }
}

LiveBlock live_block(const TrackedBlock* b) {
  return {reinterpret_cast<std::uintptr_t>(b) + kHeader, b->size, b->serial, static_cast<MemoryCategory>(b->category),
          b->phase};
}

MemoryBreakdown breakdown_of(const std::array<std::int64_t, kCategories>& bytes, std::int64_t unlinked) {
  MemoryBreakdown out;
  out.bytes = bytes;
  out.bytes[static_cast<std::size_t>(MemoryCategory::Other)] += unlinked;
  for (const std::int64_t b : out.bytes) out.allocated += b;
  return out;
}

/// The live bytes by category now, with the headers as reserved. Under g_list_mutex.
MemoryBreakdown live_breakdown() {
  MemoryBreakdown out = breakdown_of(g_category_bytes, g_unlinked_bytes.load());
  out.reserved = out.allocated + g_blocks.load() * static_cast<std::int64_t>(kHeader);
  return out;
}

/// Every listed block, oldest first, at most kMaxListedBlocks (`left_out` counts the rest).
/// Under g_list_mutex. Throws std::bad_alloc when the copy itself finds no memory.
std::vector<LiveBlock> list_blocks(std::int64_t& left_out) {
  std::vector<LiveBlock> out;
  out.reserve(static_cast<std::size_t>(std::min(g_linked_count, kMaxListedBlocks)));
  for (const TrackedBlock* b = g_list.next; b != &g_list && static_cast<std::int64_t>(out.size()) < kMaxListedBlocks;
       b = b->next) {
    out.push_back(live_block(b));
  }
  left_out = g_linked_count - static_cast<std::int64_t>(out.size());
  return out;
}

/// Keeps what was live at this thread's refused allocation of `size` bytes. Never throws: the
/// caller's out-of-memory error is what the allocation ends in.
void capture_refusal(std::int64_t size) noexcept {
  if (!g_categories.load(std::memory_order_relaxed)) return;
  t_refusal.reset();  // its memory first
  try {
    auto r = std::make_shared<detail::Refusal>();
    std::lock_guard<std::mutex> lock(g_list_mutex);
    r->live = breakdown_of(g_category_bytes, g_unlinked_bytes.load(std::memory_order_relaxed));
    r->live.reserved = r->live.allocated;
    r->requested = size;
    r->sequence = ++g_refusals;
    // Every live block, for the snapshot (memory_snapshot.h); a system that refuses this copy
    // too gets the categories alone.
    try {
      r->blocks = list_blocks(r->blocks_left_out);
    } catch (const std::bad_alloc&) {
      r->blocks.clear();
      r->blocks_left_out = g_linked_count;
    }
    g_last_refusal = r;
    t_refusal = std::move(r);
  } catch (const std::exception&) {
    // No memory even for the record: the error goes without it.
  }
}

class TrackingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) TRAINER_ALLOCATOR_ALLOCATE_CONST override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &tracked_free, cpu};
    const auto size = static_cast<std::int64_t>(n);
    // Reserve the bytes against the budget atomically, so concurrent allocations near the
    // limit are judged exactly.
    const std::int64_t limit = g_limit.load(std::memory_order_relaxed);
    std::int64_t in_use = g_allocated.load(std::memory_order_relaxed);
    do {
      if (limit > 0 && in_use + size > limit) {
        g_ooms.fetch_add(1, std::memory_order_relaxed);
        g_last_failed.store(size, std::memory_order_relaxed);
        capture_refusal(size);
        TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", format_bytes(size), "; ",
                         format_bytes(in_use), " in use; ", format_bytes(limit), " budget (memory.limit_mb)");
      }
    } while (!g_allocated.compare_exchange_weak(in_use, in_use + size, std::memory_order_relaxed));
    const std::int64_t now = in_use + size;
    void* raw = nullptr;
    if (posix_memalign(&raw, kHeader, n + kHeader) != 0 || raw == nullptr) {
      g_allocated.fetch_sub(size, std::memory_order_relaxed);
      g_ooms.fetch_add(1, std::memory_order_relaxed);
      g_last_failed.store(size, std::memory_order_relaxed);
      capture_refusal(size);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: the system refused ", format_bytes(size), "; ",
                       format_bytes(now - size), " in use");
    }
    auto* b = static_cast<TrackedBlock*>(raw);
    b->size = size;
    b->linked = false;
    b->serial = static_cast<std::uint64_t>(g_total_allocs.fetch_add(1, std::memory_order_relaxed)) + 1;
    g_blocks.fetch_add(1, std::memory_order_relaxed);
    bump_peak(now);
    if (g_categories.load(std::memory_order_relaxed)) {
      link(b);
    } else {
      g_unlinked_bytes.fetch_add(size, std::memory_order_relaxed);
    }
    void* data = static_cast<char*>(raw) + kHeader;
    return {data, data, &tracked_free, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_free; }
  // Pure virtual since LibTorch 2.3 (no `override`: 1.13 has no such function).
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
};

}  // namespace

void install_cpu_tracking_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked on purpose: tensors freed during static destruction still call its deleter.
    static auto* allocator = new TrackingCpuAllocator();
    c10::SetCPUAllocator(allocator, /*priority=*/100);
    g_installed.store(true);
  });
}

MemoryCategoryScope::MemoryCategoryScope(MemoryCategory category)
    : previous_(static_cast<MemoryCategory>(t_category)), had_own_(t_tagged) {
  detail::set_thread_memory_category(category);
}

MemoryCategoryScope::~MemoryCategoryScope() {
  t_category = static_cast<std::uint8_t>(previous_);
  t_tagged = had_own_;
}

namespace detail {

MemoryStats cpu_memory_stats() {
  MemoryStats s;
  if (!g_installed.load()) return s;
  s.allocated = g_allocated.load();
  s.reserved = s.allocated + g_blocks.load() * static_cast<std::int64_t>(kHeader);
  s.peak_allocated = std::max(g_peak.load(), s.allocated);
  s.num_ooms = g_ooms.load();
  s.limit = g_limit.load();
  s.last_failed_request = g_last_failed.load();
  s.num_allocations = g_total_allocs.load();
  return s;
}

void cpu_reset_peak() { g_peak.store(g_allocated.load()); }

void cpu_set_limit(std::int64_t bytes) { g_limit.store(bytes < 0 ? 0 : bytes); }

void cpu_clear(bool force) {
  if (force) malloc_trim(0);
}

void set_thread_memory_category(MemoryCategory category) {
  // A category out of range would index past the counters.
  TRAINER_CHECK(static_cast<std::size_t>(category) < kCategories, "memory category ", static_cast<int>(category),
                " does not exist: there are ", kCategories, " (MemoryCategory)");
  t_category = static_cast<std::uint8_t>(category);
  t_tagged = true;
}

void set_run_memory_tag(MemoryCategory category, std::uint8_t phase) {
  g_run_tag.store(static_cast<std::uint16_t>(static_cast<unsigned>(category) << 8 | phase), std::memory_order_relaxed);
}

MemoryTag current_memory_tag() {
  if (t_tagged) return {t_category, t_phase};
  const std::uint16_t tag = g_run_tag.load(std::memory_order_relaxed);
  return {static_cast<std::uint8_t>(tag >> 8), static_cast<std::uint8_t>(tag & 0xff)};
}

bool cpu_categories_on() { return g_installed.load() && g_categories.load(); }

void cpu_set_categories(bool on) { g_categories.store(on); }

MemoryBreakdown cpu_breakdown() {
  std::lock_guard<std::mutex> lock(g_list_mutex);
  return live_breakdown();
}

MemoryBreakdown cpu_peak_breakdown() {
  std::lock_guard<std::mutex> lock(g_list_mutex);
  MemoryBreakdown out = breakdown_of(g_window_peak_bytes, g_window_peak_unlinked);
  out.reserved = out.allocated;
  return out;
}

void cpu_reset_peak_breakdown() {
  std::lock_guard<std::mutex> lock(g_list_mutex);
  g_window_peak_unlinked = g_unlinked_bytes.load();
  g_window_peak = g_linked_bytes + g_window_peak_unlinked;
  g_window_peak_bytes = g_category_bytes;
}

bool cpu_attribute(const at::Tensor& tensor, MemoryCategory category) {
  if (!tensor.defined() || !tensor.has_storage() || !tensor.device().is_cpu()) return false;
  const c10::DataPtr& ptr = tensor.storage().data_ptr();
  if (ptr.get() == nullptr || ptr.get_deleter() != &tracked_free) return false;  // not one of ours
  TrackedBlock* b = block_of(ptr.get());
  if (!b->linked) return false;  // allocated while categories were off: counted as other
  const auto to = static_cast<std::uint8_t>(category);
  std::lock_guard<std::mutex> lock(g_list_mutex);
  if (b->category == to) return true;
  g_category_bytes[b->category] -= b->size;
  g_category_bytes[to] += b->size;
  b->category = to;
  return true;
}

std::uint64_t cpu_refusal_mark() {
  std::lock_guard<std::mutex> lock(g_list_mutex);
  return g_refusals;
}

RefusalPtr cpu_take_refusal(std::uint64_t mark) {
  RefusalPtr own = std::exchange(t_refusal, nullptr);
  if (!own && mark == UINT64_MAX) return nullptr;  // only its own asked for: no lock (a loader read)
  std::lock_guard<std::mutex> lock(g_list_mutex);
  if (own) {
    if (g_last_refusal == own) g_last_refusal.reset();
    return own;
  }
  if (g_last_refusal && g_last_refusal->sequence > mark) return std::exchange(g_last_refusal, nullptr);
  return nullptr;
}

void cpu_keep_refusal(RefusalPtr refusal) {
  if (refusal) t_refusal = std::move(refusal);
}

MemoryBreakdown cpu_live(std::vector<LiveBlock>& blocks, std::int64_t& left_out) {
  std::lock_guard<std::mutex> lock(g_list_mutex);
  blocks = list_blocks(left_out);
  return live_breakdown();
}

void set_thread_memory_phase(std::uint8_t code) {
  t_phase = code;
  t_tagged = true;
}

MemoryTagScope::MemoryTagScope(MemoryCategory category, std::uint8_t phase)
    : category_(t_category), phase_(t_phase), tagged_(t_tagged) {
  t_category = static_cast<std::uint8_t>(category);
  t_phase = phase;
  t_tagged = true;
}

MemoryTagScope::~MemoryTagScope() {
  t_category = category_;
  t_phase = phase_;
  t_tagged = tagged_;  // a thread that had no tag of its own takes the run's again
}

}  // namespace detail
}  // namespace trainer
