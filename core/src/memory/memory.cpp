#include "trainer/memory.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "memory/backend.h"
#include "trainer/error.h"

namespace trainer {

namespace {
// CUDA devices go to the CUDA backend, compiled only against a LibTorch with CUDA; a build
// without it refuses them loudly rather than reporting zeros.
/// LibTorch's "cuda" without an index means the current device, 0 for trainer.
[[maybe_unused]] int cuda_index(const c10::Device& d) { return d.has_index() ? d.index() : 0; }
[[noreturn]] void no_backend(const c10::Device& d, const char* what) {
  throw Error(fmt::format("{} on {}: this build has no memory backend for {} (CUDA needs a LibTorch with CUDA)", what,
                          d.str(), c10::DeviceTypeName(d.type(), true)));
}
}  // namespace

MemoryStats memory_stats(const c10::Device& device) {
  if (device.is_cpu()) return detail::cpu_memory_stats();
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) return detail::cuda_memory_stats(cuda_index(device));
#endif
  no_backend(device, "memory_stats");
}

void reset_peak_memory(const c10::Device& device) {
  if (device.is_cpu()) return detail::cpu_reset_peak();
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) return detail::cuda_reset_peak(cuda_index(device));
#endif
  no_backend(device, "reset_peak_memory");
}

void set_memory_limit(const c10::Device& device, std::int64_t bytes) {
  if (device.is_cpu()) {
    if (bytes > 0) install_cpu_tracking_allocator();
    return detail::cpu_set_limit(bytes);
  }
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) return detail::cuda_set_limit(cuda_index(device), bytes);
#endif
  no_backend(device, "set_memory_limit");
}

void set_memory_fraction(const c10::Device& device, double fraction) {
  TRAINER_CHECK_T(UsageError, fraction > 0.0 && fraction <= 1.0, "memory fraction ", fraction, " is outside (0, 1]");
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) return detail::cuda_set_fraction(cuda_index(device), fraction);
#endif
  if (device.is_cpu()) {
    return set_memory_limit(device, static_cast<std::int64_t>(static_cast<double>(host_memory().total) * fraction));
  }
  no_backend(device, "set_memory_fraction");
}

bool has_memory_backend(const c10::Device& device) {
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) return true;
#endif
  return device.is_cpu();
}

void clear_memory(const c10::Device& device, bool force) {
  if (device.is_cpu()) detail::cpu_clear(force);
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) detail::cuda_clear(cuda_index(device), force);
#endif
}

namespace {
constexpr std::array<const char*, kMemoryCategoryCount> kCategoryNames = {
    "other", "parameters", "gradients", "optimizer_state", "activations", "batch", "evaluation", "dataset"};
}  // namespace

const char* memory_category_name(MemoryCategory category) {
  return kCategoryNames.at(static_cast<std::size_t>(category));
}

std::optional<MemoryCategory> memory_category_named(std::string_view name) {
  for (std::size_t i = 0; i < kCategoryNames.size(); ++i) {
    if (name == kCategoryNames[i]) return static_cast<MemoryCategory>(i);
  }
  return std::nullopt;
}

MemoryCategory MemoryBreakdown::largest() const {
  std::size_t best = 0;
  for (std::size_t i = 1; i < bytes.size(); ++i) {
    if (bytes[i] > bytes[best]) best = i;
  }
  return static_cast<MemoryCategory>(best);
}

std::string largest_category_text(const MemoryBreakdown& breakdown) {
  const MemoryCategory top = breakdown.largest();
  const double share = breakdown.allocated > 0 ? 100.0 * double(breakdown[top]) / double(breakdown.allocated) : 0.0;
  return fmt::format("{} {:.0f} % of {}", memory_category_name(top), share, format_bytes(breakdown.allocated));
}

bool has_memory_categories(const c10::Device& device) {
  if (device.is_cpu()) return detail::cpu_categories_on();
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) return detail::cuda_categories_on();
#endif
  return false;
}

void set_memory_categories(bool on) {
  detail::cpu_set_categories(on);
#ifdef TRAINER_WITH_CUDA
  detail::cuda_set_categories(on);
#endif
}

bool detail::track_memory_categories(const c10::Device& device, std::string* why) {
  if (device.is_cpu()) return true;
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) return detail::cuda_track_categories(cuda_index(device), why);
#endif
  if (why) *why = "this build splits memory into categories on the CPU and on CUDA only";
  return false;
}

namespace {
void need_categories(const c10::Device& device, const char* what) {
  if (has_memory_categories(device)) return;
  std::string why = "this build splits memory into categories on the CPU and on CUDA only";
  if (device.is_cpu())
    why = "memory categories are off (memory.categories = false), or the tracking allocator is not installed";
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) {
    why = detail::cuda_categories_tracked() ? "memory categories are off (memory.categories = false)"
                                            : "the caching allocator's allocations are not being followed (a run on "
                                              "this GPU with memory.categories = true starts that)";
  }
#endif
  throw Error(fmt::format("{} on {}: {}", what, device.str(), why));
}
}  // namespace

MemoryBreakdown memory_breakdown(const c10::Device& device) {
  need_categories(device, "memory_breakdown");
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) return detail::cuda_breakdown(cuda_index(device));
#endif
  return detail::cpu_breakdown();
}

MemoryBreakdown peak_memory_breakdown(const c10::Device& device) {
  need_categories(device, "peak_memory_breakdown");
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) return detail::cuda_peak_breakdown(cuda_index(device));
#endif
  return detail::cpu_peak_breakdown();
}

void reset_peak_breakdown(const c10::Device& device) {
  need_categories(device, "reset_peak_breakdown");
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) return detail::cuda_reset_peak_breakdown(cuda_index(device));
#endif
  detail::cpu_reset_peak_breakdown();
}

bool attribute_memory(const at::Tensor& tensor, MemoryCategory category) {
  // A category out of range would index past the counters of either backend.
  TRAINER_CHECK(static_cast<std::size_t>(category) < kMemoryCategoryCount, "attribute_memory: memory category ",
                static_cast<int>(category), " does not exist: there are ", kMemoryCategoryCount, " (MemoryCategory)");
#ifdef TRAINER_WITH_CUDA
  if (tensor.defined() && tensor.device().is_cuda()) return detail::cuda_attribute(tensor, category);
#endif
  return detail::cpu_attribute(tensor, category);
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  // Fallback: CUDA libraries (cuBLAS, cuDNN) report OOM as a plain c10::Error.
  if (dynamic_cast<const c10::Error*>(&e)) {
    const std::string msg = e.what();
    return msg.find("out of memory") != std::string::npos ||
           msg.find("CUBLAS_STATUS_ALLOC_FAILED") != std::string::npos ||
           msg.find("CUDNN_STATUS_ALLOC_FAILED") != std::string::npos;
  }
  return false;
}

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf,
                  v >= 100 || v <= -100 ? "%.0f %s"
                  : v >= 10 || v <= -10 ? "%.1f %s"
                                        : "%.2f %s",
                  v, units[u]);
  }
  return buf;
}

namespace {
// "MemTotal:       24589384 kB" -> bytes.
std::int64_t read_kb_field(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    std::int64_t kb = 0;
    fields >> kb;
    return kb * 1024;
  }
  return 0;
}
}  // namespace

HostMemory host_memory() {
  HostMemory m;
  m.total = read_kb_field("/proc/meminfo", "MemTotal");
  m.available = read_kb_field("/proc/meminfo", "MemAvailable");
  m.process_rss = read_kb_field("/proc/self/status", "VmRSS");
  m.process_peak_rss = read_kb_field("/proc/self/status", "VmHWM");
  return m;
}

MemoryMonitor::MemoryMonitor(const c10::Device& device) : device_(device) {
  start_ = memory_stats(device_).allocated;
  reset_peak_memory(device_);
}

std::int64_t MemoryMonitor::delta() const { return memory_stats(device_).allocated - start_; }

std::int64_t MemoryMonitor::peak_delta() const { return memory_stats(device_).peak_allocated - start_; }

}  // namespace trainer
