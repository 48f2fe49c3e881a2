#pragma once
// Smoke runs. ctest runs every benchmark once with TRAINER_BENCH_SMOKE=1 to prove that it still
// builds and runs; the benchmarks then shrink their sizes (steps, images, models, iterations)
// so that the run takes seconds. Figures come only from full runs (docs/benchmarks.md).
#include <cstdlib>
#include <cstring>

namespace trainer::bench {

/// True in a ctest smoke run (TRAINER_BENCH_SMOKE=1).
inline bool smoke() {
  const char* v = std::getenv("TRAINER_BENCH_SMOKE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

/// `full` in a measuring run, `small` in a smoke run.
template <class T>
T full_or_smoke(T full, T small) {
  return smoke() ? small : full;
}

}  // namespace trainer::bench
