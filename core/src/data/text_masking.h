#pragma once
// BERT's masking rule for dataset.masked_lm, as transformers' DataCollatorForLanguageModeling
// draws it, with one random stream per (seed, epoch, sample): a sample's masks are the same
// whichever worker reads it, in whatever batch.
#include <cstdint>

namespace trainer::detail {

/// dataset.masked_lm's settings.
struct Masking {
  double probability = 0.15;
  std::uint64_t seed = 0;
  std::int64_t mask_id = 0;
  std::int64_t vocab = 0;  ///< a random replacement is below this (the tokenizer's id limit)
};

/// The "epoch" of evaluation's masks: drawn once, the same at every evaluation.
constexpr std::uint64_t kEvalMasks = ~std::uint64_t{0};

/// The seed of sample `index`'s stream in `epoch`: splitmix64's finaliser over the three.
std::uint64_t mask_stream(std::uint64_t seed, std::uint64_t epoch, std::uint64_t index);

/// Masks one sample of `len` tokens in place from the stream `stream`: each token whose
/// `special` mark is 0 is chosen with the probability; a chosen token's target becomes its id,
/// and it becomes the mask token (80 %), a random id below `vocab` (10 %) or stays (10 %).
/// `targets` keeps what it held (-100) where no token is chosen.
void mask_tokens(const Masking& m, std::uint64_t stream, std::int64_t* ids, const std::uint8_t* special,
                 std::int64_t len, std::int64_t* targets);

}  // namespace trainer::detail
