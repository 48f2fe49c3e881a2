// BERT's masking rule on one sample (core/src/data/text_masking.cpp, compiled in): which tokens
// are chosen, what they become, and that a stream gives the same masks every time.
#include "data/text_masking.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

namespace trainer::detail {
namespace {

constexpr std::int64_t kMask = 4, kVocab = 1000;

struct Masked {
  std::vector<std::int64_t> ids, targets;
};

/// `n` tokens with ids 100, 101, ...; every tenth one special. Masked with `p` from `stream`.
Masked masked(double p, std::uint64_t stream, std::int64_t n) {
  Masked m;
  std::vector<std::uint8_t> special(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) {
    m.ids.push_back(100 + t);
    special[static_cast<std::size_t>(t)] = t % 10 == 0;
  }
  m.targets.assign(static_cast<std::size_t>(n), -100);
  mask_tokens(Masking{p, 0, kMask, kVocab}, stream, m.ids.data(), special.data(), n, m.targets.data());
  return m;
}

// With probability 1 every token but the special ones is chosen: its target is its id; of
// 90,000 chosen tokens 80 % become the mask token, 10 % a random id below the vocabulary, 10 %
// stay (binomial: 4 standard deviations are 0.53 % of the total for 80 %, 0.40 % for 10 %;
// a random id equal to the token's own counts as staying, 1 in 1000 of them). Special tokens
// are never chosen, their targets stay -100. Probability 0 chooses none.
TEST(TextMasking, EveryTokenButTheSpecialOnesIsChosenAndBecomesMaskRandomOrItself) {
  const std::int64_t n = 100000;
  const Masked m = masked(1.0, 7, n);
  std::int64_t chosen = 0, to_mask = 0, kept = 0, random = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    const auto i = static_cast<std::size_t>(t);
    if (t % 10 == 0) {
      EXPECT_EQ(m.targets[i], -100);
      EXPECT_EQ(m.ids[i], 100 + t);
      continue;
    }
    ++chosen;
    EXPECT_EQ(m.targets[i], 100 + t);
    if (m.ids[i] == kMask) {
      ++to_mask;
    } else if (m.ids[i] == 100 + t) {
      ++kept;
    } else {
      ++random;
      EXPECT_GE(m.ids[i], 0);
      EXPECT_LT(m.ids[i], kVocab);
    }
  }
  EXPECT_EQ(chosen, 90000);
  EXPECT_NEAR(to_mask / 90000.0, 0.8, 0.0053);
  EXPECT_NEAR(random / 90000.0, 0.1, 0.0040);
  EXPECT_NEAR(kept / 90000.0, 0.1, 0.0040);

  const Masked none = masked(0.0, 7, 1000);
  for (std::size_t t = 0; t < none.ids.size(); ++t) {
    EXPECT_EQ(none.targets[t], -100);
    EXPECT_EQ(none.ids[t], 100 + static_cast<std::int64_t>(t));
  }
}

// A stream gives the same masks every time; another stream (another epoch or sample) others.
// mask_stream depends on each of seed, epoch and sample, and the evaluation's epoch differs
// from every training epoch's.
TEST(TextMasking, AStreamGivesTheSameMasksEveryTime) {
  const Masked a = masked(0.15, mask_stream(1, 2, 3), 500), b = masked(0.15, mask_stream(1, 2, 3), 500);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.targets, b.targets);
  const Masked c = masked(0.15, mask_stream(1, 3, 3), 500);
  EXPECT_NE(a.targets, c.targets);
  const std::set<std::uint64_t> streams = {mask_stream(1, 2, 3), mask_stream(2, 2, 3), mask_stream(1, 3, 3),
                                           mask_stream(1, 2, 4), mask_stream(1, kEvalMasks, 3)};
  EXPECT_EQ(streams.size(), 5u);
}

}  // namespace
}  // namespace trainer::detail
