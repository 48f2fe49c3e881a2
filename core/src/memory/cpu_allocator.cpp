// The CPU tracking allocator: counts every byte LibTorch allocates on CPU and enforces the
// memory budget (memory.limit_mb) by refusing allocations with c10::OutOfMemoryError.
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "trainer/memory.h"
#include "util/torch_compat.h"

namespace trainer {
namespace {

// NOTE: each block carries a 64-byte header holding its size, so the deleter finds the size
// from the data pointer alone; the data stays 64-byte aligned like c10's own allocator.
// oneDNN's convolution asserts DataPtr context == data pointer, hence no separate context.
constexpr std::size_t kHeader = 64;

std::atomic<std::int64_t> g_allocated{0};
std::atomic<std::int64_t> g_blocks{0};
std::atomic<std::int64_t> g_peak{0};
std::atomic<std::int64_t> g_limit{0};
std::atomic<std::int64_t> g_ooms{0};
std::atomic<std::int64_t> g_last_failed{0};
std::atomic<std::int64_t> g_total_allocs{0};
std::atomic<bool> g_installed{false};

void bump_peak(std::int64_t now) {
  std::int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void tracked_free(void* data) {
  if (!data) return;
  char* block = static_cast<char*>(data) - kHeader;
  const auto size = *reinterpret_cast<std::int64_t*>(block);
  g_allocated.fetch_sub(size, std::memory_order_relaxed);
  g_blocks.fetch_sub(1, std::memory_order_relaxed);
  std::free(block);
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
        TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", format_bytes(size), "; ",
                         format_bytes(in_use), " in use; ", format_bytes(limit), " budget (memory.limit_mb)");
      }
    } while (!g_allocated.compare_exchange_weak(in_use, in_use + size, std::memory_order_relaxed));
    const std::int64_t now = in_use + size;
    void* block = nullptr;
    if (posix_memalign(&block, kHeader, n + kHeader) != 0 || block == nullptr) {
      g_allocated.fetch_sub(size, std::memory_order_relaxed);
      g_ooms.fetch_add(1, std::memory_order_relaxed);
      g_last_failed.store(size, std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: the system refused ", format_bytes(size), "; ",
                       format_bytes(now - size), " in use");
    }
    *static_cast<std::int64_t*>(block) = size;
    g_blocks.fetch_add(1, std::memory_order_relaxed);
    g_total_allocs.fetch_add(1, std::memory_order_relaxed);
    bump_peak(now);
    void* data = static_cast<char*>(block) + kHeader;
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

}  // namespace detail
}  // namespace trainer
