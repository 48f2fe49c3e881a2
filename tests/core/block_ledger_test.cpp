// The ledger behind memory by category on CUDA: the caching allocator's trace (allocations,
// frees, segments, refusals) as the CUDA backend hands it over, checked without a GPU. The
// backend's own part (translating the trace, the observer) runs in the GPU test
// OnDevice.TheLiveMemoryIsSplitByCategoryAndAnOutOfMemoryErrorLeavesASnapshot.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "memory/backend.h"
#include "memory/block_ledger.h"
#include "trainer/memory.h"

namespace trainer::detail {
namespace {

using C = MemoryCategory;

MemoryTag tag(C category, std::uint8_t phase = 0) { return {static_cast<std::uint8_t>(category), phase}; }

std::int64_t sum(const MemoryBreakdown& b) {
  std::int64_t n = 0;
  for (const std::int64_t v : b.bytes) n += v;
  return n;
}

TEST(BlockLedger, RequestsAreRoundedAsTheCachingAllocatorRoundsThem) {
  EXPECT_EQ(caching_allocator_rounded(0), 512);
  EXPECT_EQ(caching_allocator_rounded(1), 512);
  EXPECT_EQ(caching_allocator_rounded(512), 512);
  EXPECT_EQ(caching_allocator_rounded(513), 1024);
  EXPECT_EQ(caching_allocator_rounded(12845056), 12845056);  // 3136 x 1024 floats: a multiple already
  EXPECT_EQ(caching_allocator_rounded(1000001), 1000448);
}

TEST(BlockLedger, EachLiveBlockCountsInItsCategoryUntilItIsFreed) {
  BlockLedger ledger;
  ledger.reset({0, 0});
  ledger.allocated(0, 0x1000, 512, tag(C::Parameters));
  ledger.allocated(0, 0x2000, 1024, tag(C::Activations, 3));
  ledger.allocated(1, 0x1000, 2048, tag(C::Batch));  // another device, the same address
  MemoryBreakdown b = ledger.breakdown(0);
  EXPECT_EQ(b[C::Parameters], 512);
  EXPECT_EQ(b[C::Activations], 1024);
  EXPECT_EQ(b[C::Batch], 0);
  EXPECT_EQ(b.allocated, 1536);
  EXPECT_EQ(sum(b), b.allocated);
  EXPECT_EQ(ledger.breakdown(1)[C::Batch], 2048);
  ledger.freed(0, 0x2000);
  ledger.freed(0, 0x9000);  // never seen (allocated before tracking): ignored
  ledger.freed(7, 0x1000);  // no such device: ignored
  b = ledger.breakdown(0);
  EXPECT_EQ(b[C::Activations], 0);
  EXPECT_EQ(b.allocated, 512);
  EXPECT_EQ(ledger.breakdown(1).allocated, 2048);
  // An address handed out again without its free seen replaces the old block, never adds to it.
  ledger.allocated(0, 0x1000, 4096, tag(C::Gradients));
  b = ledger.breakdown(0);
  EXPECT_EQ(b[C::Parameters], 0);
  EXPECT_EQ(b[C::Gradients], 4096);
  EXPECT_EQ(b.allocated, 4096);
  // A category out of range counts as Other rather than past the counters.
  ledger.allocated(0, 0x3000, 512, MemoryTag{200, 0});
  EXPECT_EQ(ledger.breakdown(0)[C::Other], 512);
  EXPECT_EQ(ledger.breakdown(9).allocated, 0);  // a device it does not know
}

TEST(BlockLedger, AttributingMovesAWholeBlockOnce) {
  BlockLedger ledger;
  ledger.reset({0});
  ledger.allocated(0, 0x1000, 1024, tag(C::Other));
  EXPECT_TRUE(ledger.attribute(0, 0x1000, C::Gradients));
  EXPECT_TRUE(ledger.attribute(0, 0x1000, C::Gradients));  // again: no double count
  EXPECT_FALSE(ledger.attribute(0, 0x2000, C::Gradients));
  EXPECT_FALSE(ledger.attribute(3, 0x1000, C::Gradients));
  EXPECT_FALSE(ledger.attribute(0, 0x1000, static_cast<C>(kMemoryCategoryCount)));
  const MemoryBreakdown b = ledger.breakdown(0);
  EXPECT_EQ(b[C::Gradients], 1024);
  EXPECT_EQ(b[C::Other], 0);
  ledger.freed(0, 0x1000);
  EXPECT_EQ(ledger.breakdown(0)[C::Gradients], 0);  // freed from the category it moved to
}

TEST(BlockLedger, ReservedFollowsTheSegmentsFromWhereItStarted) {
  BlockLedger ledger;
  ledger.reset({20 << 20});
  EXPECT_EQ(ledger.breakdown(0).reserved, 20 << 20);
  ledger.segment(0, 2 << 20);
  ledger.segment(0, -(20 << 20));
  EXPECT_EQ(ledger.breakdown(0).reserved, 2 << 20);
  // Never below what is allocated (segments that came before the start and are gone).
  ledger.allocated(0, 0x1000, 4 << 20, tag(C::Activations));
  const MemoryBreakdown b = ledger.breakdown(0);
  EXPECT_EQ(b.reserved, 4 << 20);
  EXPECT_EQ(b.slack(), 0);
}

TEST(BlockLedger, ThePeakIsTheSplitAtTheHighestTotal) {
  BlockLedger ledger;
  ledger.reset({0});
  ledger.allocated(0, 0x1000, 1024, tag(C::Parameters));
  ledger.reset_peak(0);
  ledger.allocated(0, 0x2000, 4096, tag(C::Activations));
  ledger.allocated(0, 0x3000, 512, tag(C::Other));
  ledger.freed(0, 0x2000);
  ledger.allocated(0, 0x4000, 2048, tag(C::Gradients));  // below the peak of 5632
  MemoryBreakdown p = ledger.peak(0);
  EXPECT_EQ(p.allocated, 1024 + 4096 + 512);
  EXPECT_EQ(p[C::Activations], 4096);
  EXPECT_EQ(p[C::Gradients], 0);
  EXPECT_EQ(p.reserved, p.allocated);
  ledger.reset_peak(0);
  p = ledger.peak(0);
  EXPECT_EQ(p.allocated, 1024 + 512 + 2048);
  EXPECT_EQ(p[C::Gradients], 2048);
}

TEST(BlockLedger, ARefusalKeepsWhatWasLiveAndIsTakenOnceAfterItsMark) {
  BlockLedger ledger;
  ledger.reset({8 << 20});
  ledger.allocated(0, 0x1000, 1024, tag(C::Parameters, 0));
  ledger.allocated(0, 0x2000, 2048, tag(C::Activations, 2));
  const std::uint64_t mark = ledger.refusal_mark();
  EXPECT_EQ(ledger.take_refusal(mark), nullptr);
  EXPECT_FALSE(ledger.refusal_wants_snapshot());
  ledger.refused(0, 6 << 20);
  // The failed attempt's memory goes after the refusal: the refusal keeps what was live then.
  ledger.freed(0, 0x2000);
  EXPECT_TRUE(ledger.refusal_wants_snapshot());
  ledger.add_allocator_snapshot("\x80\x02}.");
  ledger.add_allocator_snapshot("second");  // the first one stays
  EXPECT_FALSE(ledger.refusal_wants_snapshot());
  EXPECT_EQ(ledger.refusal_mark(), mark + 1);
  EXPECT_EQ(ledger.take_refusal(mark + 1), nullptr);  // not after that mark
  const RefusalPtr r = ledger.take_refusal(mark);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(ledger.take_refusal(mark), nullptr);  // once
  EXPECT_EQ(r->requested, 6 << 20);
  EXPECT_EQ(r->sequence, mark + 1);
  EXPECT_EQ(r->live.allocated, 3072);
  EXPECT_EQ(r->live[C::Activations], 2048);
  EXPECT_EQ(r->live.reserved, 8 << 20);
  EXPECT_EQ(r->allocator_pickle, "\x80\x02}.");
  ASSERT_EQ(r->blocks.size(), 2u);  // oldest first, with their categories and phases
  EXPECT_EQ(r->blocks[0].address, 0x1000u);
  EXPECT_EQ(r->blocks[0].category, C::Parameters);
  EXPECT_EQ(r->blocks[1].address, 0x2000u);
  EXPECT_EQ(r->blocks[1].size, 2048);
  EXPECT_EQ(r->blocks[1].phase, 2);
  EXPECT_LT(r->blocks[0].serial, r->blocks[1].serial);
  EXPECT_EQ(r->blocks_left_out, 0);
  ledger.refused(5, 1);  // a device it does not know: no refusal
  EXPECT_EQ(ledger.refusal_mark(), mark + 1);
}

TEST(BlockLedger, AListingPastItsBoundKeepsTheNewestAndCountsTheRest) {
  BlockLedger ledger;
  ledger.reset({0});
  for (std::uintptr_t i = 1; i <= 5; ++i) ledger.allocated(0, i * 0x1000, 512, tag(C::Other));
  std::vector<LiveBlock> blocks;
  std::int64_t left_out = -1;
  const MemoryBreakdown b = ledger.live(0, blocks, left_out, 3);
  EXPECT_EQ(b.allocated, 5 * 512);  // the categories count every block
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(left_out, 2);
  EXPECT_EQ(blocks[0].address, 3 * 0x1000u);
  EXPECT_EQ(blocks[2].address, 5 * 0x1000u);
  ledger.live(4, blocks, left_out);
  EXPECT_TRUE(blocks.empty());
  EXPECT_EQ(left_out, 0);
}

TEST(BlockLedger, ThreadsAllocatingAndFreeingTogetherLeaveItBalanced) {
  // The allocator's devices call from their own threads (each under its own lock).
  BlockLedger ledger;
  ledger.reset({0, 0});
  auto churn = [&](int device, std::uintptr_t base) {
    for (std::uintptr_t i = 0; i < 20000; ++i) {
      ledger.allocated(device, base + i, 512, tag(C::Activations));
      if (i % 2 == 1) {
        ledger.freed(device, base + i - 1);
        ledger.freed(device, base + i);
      }
    }
  };
  std::thread a(churn, 0, 0x100000), b(churn, 0, 0x900000), c(churn, 1, 0x100000);
  a.join();
  b.join();
  c.join();
  EXPECT_EQ(ledger.breakdown(0).allocated, 0);
  EXPECT_EQ(ledger.breakdown(1).allocated, 0);
  EXPECT_EQ(ledger.peak(0)[C::Activations] % 512, 0);
}

TEST(BlockLedger, AThreadWithoutATagOfItsOwnTakesTheRunsTag) {
  // The autograd engine's device threads run a CUDA backward without setting a tag: their
  // allocations count as the loop's phase says (OomRecovery::enter sets the run's tag).
  set_run_memory_tag(C::Activations, 2);
  MemoryTag seen{};
  std::thread([&] { seen = current_memory_tag(); }).join();
  EXPECT_EQ(seen.category, static_cast<std::uint8_t>(C::Activations));
  EXPECT_EQ(seen.phase, 2);
  // A thread that set its own keeps it, whatever the run's.
  std::thread([&] {
    MemoryCategoryScope batch(C::Batch);
    seen = current_memory_tag();
  }).join();
  EXPECT_EQ(seen.category, static_cast<std::uint8_t>(C::Batch));
  EXPECT_EQ(seen.phase, 0);
  // A scope on a thread without a tag of its own (a plugin's, in a backward hook on the
  // autograd device thread) leaves it taking the run's tag again after.
  std::thread([&] {
    { MemoryCategoryScope batch(C::Batch); }
    seen = current_memory_tag();
  }).join();
  EXPECT_EQ(seen.category, static_cast<std::uint8_t>(C::Activations));
  EXPECT_EQ(seen.phase, 2);
  set_run_memory_tag(C::Other, 0);
}

}  // namespace
}  // namespace trainer::detail
