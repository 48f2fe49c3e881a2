#include "data/epoch_order.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "trainer/error.h"

namespace trainer::detail {

at::Tensor epoch_order(std::int64_t n, bool shuffle, std::int64_t seed, std::int64_t epoch, const at::Tensor& lengths,
                       std::int64_t batch_size) {
  at::Tensor order;
  if (!shuffle) {
    order = at::arange(n, at::kLong);
  } else {
    auto gen = at::detail::createCPUGenerator(static_cast<std::uint64_t>(seed) * 1000003ULL +
                                              static_cast<std::uint64_t>(epoch));
    order = at::randperm(n, gen, at::TensorOptions(at::kLong));
  }
  return lengths.defined() ? group_by_length(order, lengths, batch_size) : order;
}

at::Tensor group_by_length(const at::Tensor& order, const at::Tensor& lengths, std::int64_t batch_size) {
  TRAINER_CHECK(batch_size > 0, "group_by_length: batch size ", batch_size);
  const at::Tensor o = order.to(at::kLong).contiguous(), len = lengths.to(at::kLong).contiguous();
  const std::int64_t n = o.numel();
  const std::int64_t* ix = o.data_ptr<std::int64_t>();
  const std::int64_t* l = len.data_ptr<std::int64_t>();
  for (std::int64_t k = 0; k < n; ++k) {
    TRAINER_CHECK(ix[k] >= 0 && ix[k] < len.numel(), "group_by_length: sample ", ix[k], " of ", len.numel());
  }
  // Groups of `batches` batches: transformers' mega_batch_mult, at most 50 and at least 1, so
  // that an epoch has about four groups or more and its order stays random.
  const std::int64_t batches = std::clamp<std::int64_t>(n / batch_size / 4, 1, kBatchesPerLengthGroup);
  const std::int64_t group = batch_size > n / batches ? n : batch_size * batches;  // >= 1 when n > 0
  at::Tensor out = o.clone();
  std::int64_t* v = out.data_ptr<std::int64_t>();
  std::int64_t longest_group = 0;  // where the group holding the longest sample begins
  for (std::int64_t begin = 0; begin < n; begin += group) {
    const std::int64_t end = std::min(n, begin + group);
    std::stable_sort(v + begin, v + end, [&](std::int64_t a, std::int64_t b) { return l[a] > l[b]; });
    if (l[v[begin]] > l[v[longest_group]]) longest_group = begin;
  }
  // The longest sample into the first batch, in exchange for the first group's longest (as
  // transformers does): the batches stay whole groups' batches.
  if (n > 0) std::swap(v[0], v[longest_group]);
  return out;
}

PaddedTokens padded_tokens(const at::Tensor& order, const at::Tensor& lengths, std::int64_t batch_size) {
  TRAINER_CHECK(batch_size > 0, "padded_tokens: batch size ", batch_size);
  const at::Tensor o = order.to(at::kLong).contiguous(), len = lengths.to(at::kLong).contiguous();
  const std::int64_t n = o.numel();
  const std::int64_t* ix = o.data_ptr<std::int64_t>();
  const std::int64_t* l = len.data_ptr<std::int64_t>();
  PaddedTokens t;
  for (std::int64_t begin = 0; begin < n; begin += batch_size) {
    const std::int64_t end = std::min(n, begin + batch_size);
    std::int64_t longest = 0;
    for (std::int64_t k = begin; k < end; ++k) {
      TRAINER_CHECK(ix[k] >= 0 && ix[k] < len.numel(), "padded_tokens: sample ", ix[k], " of ", len.numel());
      longest = std::max(longest, l[ix[k]]);
      t.real += l[ix[k]];
    }
    t.computed += longest * (end - begin);
  }
  return t;
}

}  // namespace trainer::detail
