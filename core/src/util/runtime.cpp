#include "trainer/runtime.h"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <fstream>

namespace trainer {

bool tune_cpu_allocator() {
#if defined(__GLIBC__)
  // 32 MiB is the largest mmap threshold glibc accepts on 64-bit.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

std::string check_blas(spdlog::logger& logger) {
  std::ifstream maps("/proc/self/maps");
  std::string line, found;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find("libblas") != std::string::npos || path.find("openblas") != std::string::npos ||
        path.find("libmkl") != std::string::npos) {
      found = path;
      if (path.find("openblas") != std::string::npos || path.find("mkl") != std::string::npos) break;
    }
  }
  if (!found.empty() && found.find("openblas") == std::string::npos && found.find("mkl") == std::string::npos &&
      found.find("/blas/") != std::string::npos) {
    logger.warn(
        "LibTorch is using the reference BLAS ({}): float32 math is ~60x slower than with OpenBLAS. "
        "Install libopenblas0-openmp (scripts/install-deps.sh does).",
        found);
  }
  return found;
}

}  // namespace trainer
