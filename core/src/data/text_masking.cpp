#include "data/text_masking.h"

#include <random>

namespace trainer::detail {

std::uint64_t mask_stream(std::uint64_t seed, std::uint64_t epoch, std::uint64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ULL ^ (epoch + 0x632BE59BD9B4E019ULL) * 0xBF58476D1CE4E5B9ULL ^
                    (index + 0x8CB92BA72F3D8DD7ULL) * 0x94D049BB133111EBULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void mask_tokens(const Masking& m, std::uint64_t stream, std::int64_t* ids, const std::uint8_t* special,
                 std::int64_t len, std::int64_t* targets) {
  const auto uniform = [](std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; };
  std::mt19937_64 rng(stream);
  for (std::int64_t t = 0; t < len; ++t) {
    if (special[t] != 0) continue;
    if (uniform(rng) >= m.probability) continue;
    targets[t] = ids[t];
    const double how = uniform(rng);
    if (how < 0.8) {
      ids[t] = m.mask_id;
    } else if (how < 0.9) {
      // Multiply-shift: a uniform id below vocab from 64 random bits, the same on every machine.
      ids[t] = static_cast<std::int64_t>(
          (static_cast<unsigned __int128>(rng()) * static_cast<std::uint64_t>(m.vocab)) >> 64);
    }
  }
}

}  // namespace trainer::detail
