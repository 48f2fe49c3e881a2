// Memory categories on the CPU: every live byte of the tracking allocator in one category, the
// thread's category at allocation, re-attribution by identity, the breakdown at the peak.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <thread>
#include <vector>

#include "memory/backend.h"
#include "support/test_util.h"
#include "trainer/error.h"
#include "trainer/memory.h"
#include "trainer/memory_snapshot.h"

namespace trainer {
namespace {

const c10::Device kHostDevice(c10::kCPU);

class MemoryCategories : public ::testing::Test {
 protected:
  void SetUp() override {
    install_cpu_tracking_allocator();
    set_memory_categories(true);
  }
};

std::int64_t sum(const MemoryBreakdown& b) {
  std::int64_t s = 0;
  for (const std::int64_t v : b.bytes) s += v;
  return s;
}

TEST_F(MemoryCategories, NamesRoundTrip) {
  for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) {
    const auto c = static_cast<MemoryCategory>(i);
    EXPECT_EQ(memory_category_named(memory_category_name(c)), c);
  }
  EXPECT_STREQ(memory_category_name(MemoryCategory::OptimizerState), "optimizer_state");
  EXPECT_FALSE(memory_category_named("weights").has_value());
}

TEST_F(MemoryCategories, TheThreadsCategoryAtAllocationCountsAndSumsToAllocated) {
  const MemoryBreakdown before = memory_breakdown(kHostDevice);
  at::Tensor a, b;
  {
    MemoryCategoryScope scope(MemoryCategory::Activations);
    a = torch::empty({1000}, torch::kFloat);  // 4000 bytes
    {
      MemoryCategoryScope inner(MemoryCategory::Batch);
      b = torch::empty({250}, torch::kDouble);  // 2000 bytes
    }
    EXPECT_EQ(memory_breakdown(kHostDevice)[MemoryCategory::Batch] - before[MemoryCategory::Batch], 2000);
  }
  const MemoryBreakdown now = memory_breakdown(kHostDevice);
  EXPECT_EQ(now[MemoryCategory::Activations] - before[MemoryCategory::Activations], 4000);
  EXPECT_EQ(now[MemoryCategory::Batch] - before[MemoryCategory::Batch], 2000);
  EXPECT_EQ(sum(now), now.allocated);
  EXPECT_EQ(now.allocated, memory_stats(kHostDevice).allocated);
  EXPECT_GE(now.slack(), 0);
  a.reset();
  b.reset();
  const MemoryBreakdown after = memory_breakdown(kHostDevice);
  EXPECT_EQ(after.bytes, before.bytes);  // freed bytes leave the category they were in
}

TEST_F(MemoryCategories, AttributeMovesAWholeStorageOnce) {
  MemoryCategoryScope scope(MemoryCategory::Other);
  const MemoryBreakdown before = memory_breakdown(kHostDevice);
  at::Tensor p = torch::zeros({10, 10});  // 400 bytes
  at::Tensor view = p.narrow(0, 2, 3);
  EXPECT_TRUE(attribute_memory(view, MemoryCategory::Gradients));  // the view's storage is p's
  EXPECT_TRUE(attribute_memory(p, MemoryCategory::Gradients));     // already there: nothing moves
  MemoryBreakdown now = memory_breakdown(kHostDevice);
  EXPECT_EQ(now[MemoryCategory::Gradients] - before[MemoryCategory::Gradients], 400);
  EXPECT_EQ(now[MemoryCategory::Other], before[MemoryCategory::Other]);
  EXPECT_FALSE(attribute_memory(at::Tensor(), MemoryCategory::Parameters));
  float outside[4] = {1, 2, 3, 4};
  EXPECT_FALSE(attribute_memory(torch::from_blob(outside, {4}), MemoryCategory::Parameters));
  view.reset();
  p.reset();
  EXPECT_EQ(memory_breakdown(kHostDevice).bytes, before.bytes);
}

TEST_F(MemoryCategories, BlocksAllocatedWhileOffCountAsOtherAndAreNotAttributed) {
  MemoryCategoryScope scope(MemoryCategory::Activations);
  const MemoryBreakdown before = memory_breakdown(kHostDevice);
  set_memory_categories(false);
  at::Tensor off = torch::empty({100});  // 400 bytes, not listed
  EXPECT_FALSE(has_memory_categories(kHostDevice));
  EXPECT_THROW(memory_breakdown(kHostDevice), Error);
  set_memory_categories(true);
  EXPECT_FALSE(attribute_memory(off, MemoryCategory::Parameters));
  const MemoryBreakdown now = memory_breakdown(kHostDevice);
  EXPECT_EQ(now[MemoryCategory::Other] - before[MemoryCategory::Other], 400);
  EXPECT_EQ(now[MemoryCategory::Activations], before[MemoryCategory::Activations]);
  EXPECT_EQ(sum(now), memory_stats(kHostDevice).allocated);
  off.reset();
  EXPECT_EQ(memory_breakdown(kHostDevice).bytes, before.bytes);
}

TEST_F(MemoryCategories, OtherThreadsKeepTheirOwnCategory) {
  const MemoryBreakdown before = memory_breakdown(kHostDevice);
  MemoryCategoryScope scope(MemoryCategory::Activations);
  at::Tensor from_thread;
  std::thread([&] {
    MemoryCategoryScope batch(MemoryCategory::Batch);
    from_thread = torch::empty({64}, torch::kByte);
  }).join();
  at::Tensor here = torch::empty({32}, torch::kByte);
  const MemoryBreakdown now = memory_breakdown(kHostDevice);
  EXPECT_EQ(now[MemoryCategory::Batch] - before[MemoryCategory::Batch], 64);
  EXPECT_EQ(now[MemoryCategory::Activations] - before[MemoryCategory::Activations], 32);
}

TEST_F(MemoryCategories, ThePeakBreakdownIsTheSplitAtTheHighestPoint) {
  reset_peak_breakdown(kHostDevice);
  const MemoryBreakdown base = memory_breakdown(kHostDevice);
  {
    MemoryCategoryScope scope(MemoryCategory::Activations);
    at::Tensor saved = torch::empty({1 << 18});  // 1 MiB of "activations"
    MemoryCategoryScope other(MemoryCategory::Other);
    at::Tensor temp = torch::empty({1 << 17});  // 512 KiB temporary on top: the peak
  }
  {
    MemoryCategoryScope scope(MemoryCategory::Batch);
    at::Tensor small = torch::empty({1 << 16});  // 256 KiB later: lower, not a new peak
  }
  const MemoryBreakdown peak = peak_memory_breakdown(kHostDevice);
  EXPECT_EQ(peak.allocated - base.allocated, (1 << 20) + (1 << 19));
  EXPECT_EQ(peak[MemoryCategory::Activations] - base[MemoryCategory::Activations], 1 << 20);
  EXPECT_EQ(peak[MemoryCategory::Other] - base[MemoryCategory::Other], 1 << 19);
  EXPECT_EQ(peak[MemoryCategory::Batch], base[MemoryCategory::Batch]);
  EXPECT_EQ(sum(peak), peak.allocated);
  reset_peak_breakdown(kHostDevice);
  EXPECT_EQ(peak_memory_breakdown(kHostDevice).bytes, memory_breakdown(kHostDevice).bytes);
}

TEST_F(MemoryCategories, ASnapshotListsEveryLiveBlockWithItsCategory) {
  MemoryCategoryScope scope(MemoryCategory::Batch);
  at::Tensor t = torch::empty({12345}, torch::kByte);
  const MemorySnapshot s = memory_snapshot(kHostDevice, "asked");
  EXPECT_EQ(s.reason, "asked");
  EXPECT_EQ(s.device, "cpu");
  std::int64_t listed = 0;
  const MemoryBlockInfo* mine = nullptr;
  for (const auto& b : s.blocks) {
    listed += b.size;
    if (b.address == reinterpret_cast<std::uint64_t>(t.data_ptr())) mine = &b;
  }
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->size, 12345);
  EXPECT_EQ(mine->category, MemoryCategory::Batch);
  EXPECT_EQ(mine->phase, "");  // not allocated in a phase of the loop
  // Every listed block's bytes, and only those, are in the categories (none allocated with categories off here).
  EXPECT_LE(listed, s.live.allocated);
  EXPECT_EQ(s.blocks_left_out, 0);
  for (std::size_t i = 1; i < s.blocks.size(); ++i) EXPECT_LT(s.blocks[i - 1].serial, s.blocks[i].serial);
  testing::TempDir dir;
  write_memory_snapshot(s, dir / "snap", 3);
  const std::string text = testing::read_file(dir / "snap.json");
  // Beside it, the pickle PyTorch's viewers read (tests/memory/snapshot_in_python.py reads one in Python).
  const std::string pickle = testing::read_file(dir / "snap.pickle");
  ASSERT_GT(pickle.size(), 3u);
  EXPECT_EQ(pickle.substr(0, 3), "\x80\x02}");  // protocol 2, a dict
  EXPECT_EQ(pickle.back(), '.');
  EXPECT_NE(text.find("\"reason\": \"asked\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"blocks\": " + std::to_string(s.blocks.size())), std::string::npos) << text;
  std::size_t shown = 0;
  for (auto at = text.find("{\"size\": "); at != std::string::npos; at = text.find("{\"size\": ", at + 1)) ++shown;
  EXPECT_EQ(shown, std::min<std::size_t>(3, s.blocks.size()));
  EXPECT_THROW(memory_snapshot(c10::Device(c10::kMeta), "x"), Error);
}

TEST_F(MemoryCategories, AnUnknownCategoryIsRefused) {
  const auto unknown = static_cast<MemoryCategory>(kMemoryCategoryCount);
  EXPECT_THROW(MemoryCategoryScope scope(unknown), Error);
  at::Tensor t = torch::empty({4});
  EXPECT_THROW(attribute_memory(t, static_cast<MemoryCategory>(200)), Error);
  // Nothing changed: this thread still allocates as before, and t is where it was.
  const MemoryBreakdown before = memory_breakdown(kHostDevice);
  at::Tensor u = torch::empty({8});
  EXPECT_EQ(memory_breakdown(kHostDevice)[MemoryCategory::Other] - before[MemoryCategory::Other], 32);
}

/// Allocates `bytes` under a budget of what is in use plus 1 MiB, which refuses it; true when it was refused.
bool refused_here(std::int64_t bytes) {
  set_memory_limit(kHostDevice, memory_stats(kHostDevice).allocated + (1 << 20));
  bool refused = false;
  try {
    auto t = torch::empty({bytes}, torch::kByte);
  } catch (const c10::Error&) {
    refused = true;
  }
  set_memory_limit(kHostDevice, 0);
  return refused;
}

TEST_F(MemoryCategories, ARefusalIsItsThreadsAndAnotherThreadsOnlyWhenThatThreadLeftIt) {
  const std::int64_t mine = std::int64_t{16} << 20, theirs = std::int64_t{32} << 20;
  detail::cpu_take_refusal();
  const std::uint64_t mark = detail::cpu_refusal_mark();
  // Another thread's refusal that it took itself (a loader worker's, handed over with its
  // error) is not seen here, however recent.
  detail::RefusalPtr handed;
  std::thread([&] {
    ASSERT_TRUE(refused_here(theirs));
    handed = detail::cpu_take_refusal();
  }).join();
  ASSERT_NE(handed, nullptr);
  EXPECT_EQ(handed->requested, theirs);
  EXPECT_EQ(detail::cpu_take_refusal(mark), nullptr);
  detail::cpu_keep_refusal(handed);  // handed over: now this thread's own
  EXPECT_EQ(detail::cpu_take_refusal(mark), handed);
  EXPECT_EQ(detail::cpu_take_refusal(mark), nullptr);  // once

  // One it left (an intra-op worker's, whose error the caller rethrows) is seen after the mark
  // only; this thread's own comes first.
  const std::uint64_t before = detail::cpu_refusal_mark();
  std::thread([&] { ASSERT_TRUE(refused_here(theirs)); }).join();
  const detail::RefusalPtr left = detail::cpu_take_refusal(before);
  ASSERT_NE(left, nullptr);
  EXPECT_EQ(left->requested, theirs);
  EXPECT_GT(left->sequence, before);
  std::thread([&] { ASSERT_TRUE(refused_here(theirs)); }).join();
  const std::uint64_t after = detail::cpu_refusal_mark();
  EXPECT_EQ(detail::cpu_take_refusal(after), nullptr);  // not after the mark: an earlier attempt's
  ASSERT_TRUE(refused_here(mine));
  std::thread([&] { ASSERT_TRUE(refused_here(theirs)); }).join();  // newer, but not this thread's
  const detail::RefusalPtr own = detail::cpu_take_refusal(after);
  ASSERT_NE(own, nullptr);
  EXPECT_EQ(own->requested, mine);
  EXPECT_EQ(sum(own->live), own->live.allocated);
  const detail::RefusalPtr next = detail::cpu_take_refusal(after);  // then the one the other thread left
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->requested, theirs);
  EXPECT_EQ(detail::cpu_take_refusal(after), nullptr);
}

TEST_F(MemoryCategories, BytesAnotherThreadIsAllocatingAreNeverCountedAsOther) {
  // Another thread allocates and frees batch blocks as fast as it can; between reserving a
  // block's bytes and listing it they are in neither category, so every reading here sees
  // exactly the other bytes there were, and the batch bytes of whole blocks.
  const MemoryBreakdown before = memory_breakdown(kHostDevice);
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> churned{0};
  std::thread churn([&] {
    MemoryCategoryScope batch(MemoryCategory::Batch);
    for (; !stop.load(); churned.fetch_add(1)) at::Tensor t = torch::empty({1024}, torch::kByte);
  });
  std::int64_t wrong_other = 0, torn_batch = 0;
  // Readings while the other thread has made 100,000 blocks, and at least 20,000 of them.
  for (std::int64_t i = 0; i < 20000 || churned.load() < 100000; ++i) {
    const MemoryBreakdown b = memory_breakdown(kHostDevice);
    wrong_other += b[MemoryCategory::Other] != before[MemoryCategory::Other];
    const std::int64_t batch = b[MemoryCategory::Batch] - before[MemoryCategory::Batch];
    torn_batch += batch != 0 && batch != 1024;
  }
  stop = true;
  churn.join();
  EXPECT_GE(churned.load(), 100000);
  EXPECT_EQ(wrong_other, 0);
  EXPECT_EQ(torn_batch, 0);
}

TEST_F(MemoryCategories, AListingPastItsBoundCountsTheRest) {
  std::vector<at::Tensor> many;
  many.reserve(static_cast<std::size_t>(detail::kMaxListedBlocks) + 10);
  for (std::int64_t i = 0; i < detail::kMaxListedBlocks + 10; ++i) many.push_back(torch::empty({1}, torch::kByte));
  const MemorySnapshot s = memory_snapshot(kHostDevice, "many");
  EXPECT_EQ(static_cast<std::int64_t>(s.blocks.size()), detail::kMaxListedBlocks);
  EXPECT_GE(s.blocks_left_out, 10);
  // Listed oldest first: the newest blocks are the ones counted, not listed.
  const auto newest = reinterpret_cast<std::uint64_t>(many.back().data_ptr());
  for (const auto& b : s.blocks) ASSERT_NE(b.address, newest);
}

TEST_F(MemoryCategories, LargestIsTheFirstOfTheMost) {
  MemoryBreakdown b;
  EXPECT_EQ(b.largest(), MemoryCategory::Other);
  b.bytes[static_cast<std::size_t>(MemoryCategory::Gradients)] = 5;
  b.bytes[static_cast<std::size_t>(MemoryCategory::Activations)] = 7;
  EXPECT_EQ(b.largest(), MemoryCategory::Activations);
}

}  // namespace
}  // namespace trainer
