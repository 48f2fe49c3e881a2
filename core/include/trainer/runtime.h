#pragma once
#include <string>

#include "trainer/export.h"

namespace spdlog {
class logger;
}

namespace trainer {

/// Tunes glibc malloc for training: tensors up to 32 MiB come from the heap instead of fresh
/// mmap()s, and freed memory is kept (up to 1 GiB) instead of being returned to the OS.
/// Without it every step maps and unmaps its large activations and pays the page faults
/// (docs/benchmarks.md has the measured effect). Process-wide; idempotent.
/// Returns false when the C library refused a setting.
TRAINER_API bool tune_cpu_allocator();

/// Warns when LibTorch's float32 math runs on the reference BLAS (60x slower than OpenBLAS).
/// Returns the BLAS library mapped into the process, or "" if none was found.
TRAINER_API std::string check_blas(spdlog::logger& logger);

}  // namespace trainer
