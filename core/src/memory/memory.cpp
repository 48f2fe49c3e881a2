#include "trainer/memory.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "trainer/error.h"

namespace trainer {

namespace detail {
MemoryStats cpu_memory_stats();
void cpu_reset_peak();
void cpu_set_limit(std::int64_t bytes);
void cpu_clear(bool force);
}  // namespace detail

namespace {
// NOTE: the CUDA backend (caching-allocator stats, memory fraction, emptyCache) is compiled
// only against a LibTorch with CUDA; until it lands, CUDA devices are refused here loudly
// rather than reported as zeros.
void require_cpu(const c10::Device& d, const char* what) {
  TRAINER_CHECK(d.is_cpu(), what, " on ", d.str(), ": this build has no CUDA memory backend");
}
}  // namespace

MemoryStats memory_stats(const c10::Device& device) {
  require_cpu(device, "memory_stats");
  return detail::cpu_memory_stats();
}

void reset_peak_memory(const c10::Device& device) {
  require_cpu(device, "reset_peak_memory");
  detail::cpu_reset_peak();
}

void set_memory_limit(const c10::Device& device, std::int64_t bytes) {
  require_cpu(device, "set_memory_limit");
  if (bytes > 0) install_cpu_tracking_allocator();
  detail::cpu_set_limit(bytes);
}

void clear_memory(const c10::Device& device, bool force) {
  if (device.is_cpu()) detail::cpu_clear(force);
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
