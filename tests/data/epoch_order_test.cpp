// The order of an epoch and length-grouped batches (training.group_by_length,
// core/src/data/epoch_order.cpp, compiled into this test): a permutation of the epoch's order
// whose groups of up to 50 batches are the order's own consecutive samples, each sorted longest
// first with ties kept in order, the longest sample swapped into the first batch; the tokens a
// pass computes with its padding; and a dataset without lengths refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "data/epoch_order.h"
#include "support/test_util.h"
#include "trainer/data.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

std::vector<std::int64_t> vec(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

TEST(EpochOrder, IsAPermutationFromTheSeedAndEpochAloneOrIndexOrderWithoutShuffling) {
  EXPECT_EQ(vec(detail::epoch_order(5, false, 7, 3, {}, 2)), (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  const auto a = vec(detail::epoch_order(100, true, 7, 0, {}, 8));
  EXPECT_EQ(a, vec(detail::epoch_order(100, true, 7, 0, {}, 8)));
  EXPECT_NE(a, vec(detail::epoch_order(100, true, 7, 1, {}, 8)));
  EXPECT_NE(a, vec(detail::epoch_order(100, true, 8, 0, {}, 8)));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 100; ++i) EXPECT_EQ(sorted[static_cast<std::size_t>(i)], i);
}

/// The expected grouping: the order's consecutive groups of `group` samples, each sorted
/// longest first with ties in order, then the first sample swapped with the first sample of the
/// group whose first is the longest.
std::vector<std::int64_t> expected_groups(const std::vector<std::int64_t>& o, const std::vector<std::int64_t>& len,
                                          std::size_t group) {
  std::vector<std::int64_t> e = o;
  std::size_t longest = 0;
  for (std::size_t b = 0; b < e.size(); b += group) {
    const auto end = e.begin() + static_cast<std::ptrdiff_t>(std::min(e.size(), b + group));
    std::stable_sort(e.begin() + static_cast<std::ptrdiff_t>(b), end, [&](std::int64_t x, std::int64_t y) {
      return len[static_cast<std::size_t>(x)] > len[static_cast<std::size_t>(y)];
    });
    if (len[static_cast<std::size_t>(e[b])] > len[static_cast<std::size_t>(e[longest])]) longest = b;
  }
  if (!e.empty()) std::swap(e[0], e[longest]);
  return e;
}

TEST(GroupByLength, GroupsOfUpToFiftyBatchesSortedLongestFirstWithTheLongestSampleFirst) {
  // 1,030 samples in batches of 4: 1030 / 4 / 4 = 64 batches a group, at most 50: groups of 200
  // samples, the last of 30. The longest sample is in that last, partial group: swapped into
  // the first batch, every batch still lies within one group.
  const std::int64_t n = 1030, batch = 4;
  const at::Tensor order = detail::epoch_order(n, true, 3, 0, {}, batch);
  const auto o = vec(order);
  at::Tensor lengths = at::randint(1, 60, {n}, at::kLong);
  lengths[o[1010]] = 100;
  const auto len = vec(lengths);
  const auto g = vec(detail::group_by_length(order, lengths, batch));
  EXPECT_EQ(g, expected_groups(o, len, 200));
  EXPECT_EQ(g.front(), o[1010]);
  for (std::size_t b = 0; b < g.size(); b += 200) {
    std::vector<std::int64_t> in_order(o.begin() + static_cast<std::ptrdiff_t>(b),
                                       o.begin() + static_cast<std::ptrdiff_t>(std::min(g.size(), b + 200)));
    std::vector<std::int64_t> in_group(g.begin() + static_cast<std::ptrdiff_t>(b),
                                       g.begin() + static_cast<std::ptrdiff_t>(std::min(g.size(), b + 200)));
    std::sort(in_order.begin(), in_order.end());
    std::sort(in_group.begin(), in_group.end());
    // The same samples, but for the two swapped.
    if (b != 0 && b != 1000) {
      EXPECT_EQ(in_group, in_order) << "group at " << b;
    }
  }
  EXPECT_EQ(vec(detail::group_by_length(order, lengths, batch)), g);  // the same inputs, the same order
  // A smaller set keeps several groups, so that the epoch stays random: 48 samples in batches
  // of 4 are groups of 3 batches; 10 samples in batches of 4 groups of one batch.
  const at::Tensor small = detail::epoch_order(48, true, 5, 0, {}, 4);
  const at::Tensor small_lengths = at::randint(1, 30, {48}, at::kLong);
  EXPECT_EQ(vec(detail::group_by_length(small, small_lengths, 4)), expected_groups(vec(small), vec(small_lengths), 12));
  const at::Tensor ten = detail::epoch_order(10, true, 5, 0, {}, 4);
  EXPECT_EQ(vec(detail::group_by_length(ten, small_lengths.narrow(0, 0, 10), 4)),
            expected_groups(vec(ten), vec(small_lengths.narrow(0, 0, 10)), 4));
  // The longest sample in another group than the first: swapped with the first group's longest.
  const at::Tensor twelve = at::tensor(std::vector<std::int64_t>{5, 1, 2, 3, 4, 4, 4, 4, 1, 20, 1, 1});
  EXPECT_EQ(vec(detail::group_by_length(at::arange(12, at::kLong), twelve, 1)),
            (std::vector<std::int64_t>{9, 2, 1, 4, 5, 3, 6, 7, 8, 0, 10, 11}));
}

TEST(GroupByLength, PaddingFallsAndEqualLengthsKeepTheirOrder) {
  // Lengths alternating long and short: batches of 2 pad each short one to a long one. Groups
  // of 16 / 2 / 4 = 2 batches.
  const at::Tensor lengths =
      at::tensor(std::vector<std::int64_t>{16, 1, 15, 2, 14, 3, 13, 4, 12, 5, 11, 6, 10, 7, 9, 8});
  const at::Tensor order = at::arange(16, at::kLong);
  const auto before = detail::padded_tokens(order, lengths, 2);
  EXPECT_EQ(before.real, 136);
  EXPECT_EQ(before.computed, 2 * (16 + 15 + 14 + 13 + 12 + 11 + 10 + 9));
  const at::Tensor grouped = detail::group_by_length(order, lengths, 2);
  EXPECT_EQ(vec(grouped), (std::vector<std::int64_t>{0, 2, 3, 1, 4, 6, 7, 5, 8, 10, 11, 9, 12, 14, 15, 13}));
  const auto after = detail::padded_tokens(grouped, lengths, 2);
  EXPECT_EQ(after.real, 136);
  EXPECT_EQ(after.computed, 2 * (16 + 2 + 14 + 4 + 12 + 6 + 10 + 8));
  // A short last batch pads to its own longest.
  EXPECT_EQ(detail::padded_tokens(order, lengths, 3).computed, 3 * (16 + 14 + 13 + 11 + 10) + 8);
  // Equal lengths: the order's own order (groups of 5).
  const at::Tensor same = at::full({20}, 3, at::kLong);
  const at::Tensor shuffled = detail::epoch_order(20, true, 9, 0, {}, 1);
  EXPECT_EQ(vec(detail::group_by_length(shuffled, same, 1)), vec(shuffled));
  EXPECT_EQ(detail::group_by_length(at::empty({0}, at::kLong), same, 4).numel(), 0);
}

/// Samples whose lengths are their indices plus one, or no lengths.
class Lengths final : public Dataset {
 public:
  explicit Lengths(bool with) : with_(with) {}
  std::int64_t size() const override { return 6; }
  Batch get(const at::Tensor& idx) const override { return {idx.to(at::kFloat).unsqueeze(1), idx}; }
  DataSpec spec() const override { return {}; }
  at::Tensor lengths() const override { return with_ ? at::arange(1, 7, at::kLong) : at::Tensor(); }

 private:
  bool with_;
};

TEST(GroupByLength, ALimitedDatasetGivesItsSamplesLengths) {
  EXPECT_EQ(vec(limit_dataset(std::make_shared<Lengths>(true), 4)->lengths()), (std::vector<std::int64_t>{1, 2, 3, 4}));
  EXPECT_FALSE(limit_dataset(std::make_shared<Lengths>(false), 4)->lengths().defined());
}

class GroupByLengthRuns : public testing::TrainerTest {};

TEST_F(GroupByLengthRuns, ADatasetWithoutLengthsIsAUsageErrorNamingIt) {
  const RunResult r = fit(testing::kSmallRun, {"training.group_by_length=true"}, "images");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("training.group_by_length = true: the training set (dataset 'synthetic', as plugins left "
                           "it) gives no sample lengths"),
            std::string::npos)
      << r.message;
}

}  // namespace
}  // namespace trainer
