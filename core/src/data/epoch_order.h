#pragma once
// Private: the order in which an epoch visits the training samples, and length-grouped batches
// (training.group_by_length).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace trainer::detail {

/// The most batches a length group holds: transformers' LengthGroupedSampler sorts mega-batches
/// of up to 50 batches.
inline constexpr std::int64_t kBatchesPerLengthGroup = 50;

/// The samples 0..n-1 in the order epoch `epoch` trains on them: a permutation drawn from
/// (`seed`, `epoch`) alone when `shuffle`, else in index order; then, when `lengths` is defined
/// ([n] int64, each sample's length), grouped by length (group_by_length()).
at::Tensor epoch_order(std::int64_t n, bool shuffle, std::int64_t seed, std::int64_t epoch, const at::Tensor& lengths,
                       std::int64_t batch_size);

/// `order` regrouped so that each batch holds samples of similar length, as transformers'
/// group_by_length does: consecutive groups of `order`, each of n / batch_size / 4 batches
/// (`batch_size` samples each; at least 1 and at most kBatchesPerLengthGroup, so that an
/// epoch has several groups and stays random), each sorted longest first (equal lengths keep
/// their order in `order`); then the longest sample of all is swapped with the first group's
/// longest, so that the first batch holds it: in a run of one process the step that needs the
/// most memory is the first. Which samples a group holds comes from `order`.
at::Tensor group_by_length(const at::Tensor& order, const at::Tensor& lengths, std::int64_t batch_size);

/// The tokens an epoch in `order` computes, each batch of `batch_size` padded to its longest
/// sample (`computed`), and the tokens of its samples (`real`).
struct PaddedTokens {
  std::int64_t computed = 0;
  std::int64_t real = 0;
};
PaddedTokens padded_tokens(const at::Tensor& order, const at::Tensor& lengths, std::int64_t batch_size);

}  // namespace trainer::detail
