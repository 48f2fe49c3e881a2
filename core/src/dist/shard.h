#pragma once
// Private: which part of a global batch (or of the test split) a rank takes.
#include <algorithm>
#include <cstdint>
#include <utility>

namespace trainer {

/// [begin, end) of rank `rank` of `size` in `n` items: contiguous parts whose sizes differ by at
/// most one (the first n % size ranks take one more). Every item belongs to exactly one rank.
inline std::pair<std::int64_t, std::int64_t> shard_range(std::int64_t n, std::int64_t rank, std::int64_t size) {
  const std::int64_t base = n / size, extra = n % size;
  const std::int64_t begin = rank * base + std::min(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

}  // namespace trainer
