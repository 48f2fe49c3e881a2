// `trainer estimate` with oom_backoff's ladder: the rungs' probes (every block checkpointed;
// AdamW's moments in 16 and 8 bits with allow_inexact) predict the peak on each rung against
// real steps on it (the CPU tracking allocator: deterministic bytes), and the cheapest
// configuration that fits a budget runs under it, started there by oom_backoff's start keys,
// without running out of memory.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "estimate.h"
#include "short_run.h"
#include "support/test_util.h"
#include "trainer/error.h"

namespace {

using trainer::testing::TempDir;
using trainer::tune::EstimateRequest;
using trainer::tune::MemoryEstimate;

// Fashion-MNIST under a 100 MiB budget, oom_backoff with its default ladder, AdamW.
const std::string kLadderRecipe = std::string(TRAINER_SOURCE_DIR) + "/recipes/fashion_mnist_tight.toml";
const std::vector<std::string> kLadderVit = {"model=vit_tiny", "model.num_layers=6"};
constexpr double kLadderMiB = 1024.0 * 1024.0;

/// Real steps of the tight recipe at micro-batch `m` of `batch`, no budget unless `limit_mb`.
trainer::tune::ShortRunResult ladder_run(const std::vector<std::string>& overrides, std::int64_t batch, std::int64_t m,
                                         const std::string& dir, std::int64_t blocks = 0, int bits = 0) {
  trainer::tune::ShortRunSpec spec;
  spec.recipe = kLadderRecipe;
  spec.overrides = overrides;
  spec.batch_size = batch;
  spec.micro_batch = m;
  spec.checkpointed_blocks = blocks;
  spec.moment_bits = bits;
  spec.work_dir = dir;
  return trainer::tune::run_short(spec);
}

EstimateRequest ladder_request(const TempDir& tmp, std::vector<std::string> overrides) {
  EstimateRequest req;
  req.recipe = kLadderRecipe;
  req.work_dir = tmp.str();
  req.overrides = std::move(overrides);
  return req;
}

// k of N blocks checkpointed is predicted on the straight line between the plain peak and the
// every-block peak. Both ends are fits (within 10 % of real steps, as every prediction); between
// them the line lies above the real peaks (a block recomputes its activations after the later
// blocks' are freed), so a prediction there may be high (up to 25 %) but not low (10 %).
TEST(EstimateLadder, EachCheckpointRungsPeakIsPredictedAgainstRealStepsOnIt) {
  TempDir tmp;
  const MemoryEstimate e = trainer::tune::estimate_memory(ladder_request(tmp, kLadderVit));
  ASSERT_EQ(e.model_blocks, 6);
  EXPECT_TRUE(e.moment_rungs.empty()) << "allow_inexact is off: no moment rungs";
  EXPECT_EQ(e.moment_bits, 32);
  EXPECT_LT(e.checkpointed_per_sample, 0.7 * e.per_sample) << "checkpointed blocks keep their inputs only";
  // The table: as configured, then oom_backoff's progression 2, 4, 6 of 6 blocks.
  ASSERT_EQ(e.rungs.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(e.rungs[i].checkpointed_blocks, std::int64_t(2 * i));
  EXPECT_DOUBLE_EQ(e.rungs[0].time_ratio, 1.0);
  for (std::size_t i = 1; i < 4; ++i) {
    EXPECT_LT(e.rungs[i].peak, e.rungs[i - 1].peak);
    EXPECT_GT(e.rungs[i].time_ratio, 0.0);
  }
  for (const std::int64_t k : {0, 2, 3, 6}) {
    const auto r = ladder_run(kLadderVit, 128, 128, tmp / ("k" + std::to_string(k)), k);
    ASSERT_EQ(r.exit_code, 0) << r.message;
    EXPECT_EQ(r.checkpointed_blocks, k);
    const double predicted = double(e.predict_on_rung(128, 128, k, 0)), measured = double(r.peak());
    const std::string what = std::to_string(k) + " of 6 blocks: predicted " + std::to_string(predicted / kLadderMiB) +
                             " MiB, measured " + std::to_string(measured / kLadderMiB) + " MiB";
    EXPECT_GT(predicted, 0.90 * measured) << what;
    EXPECT_LT(predicted, (k == 0 || k == 6 ? 1.10 : 1.25) * measured) << what;
  }
}

// A budget where no micro-batch down to oom_backoff's floor (64) fits on its own but
// checkpointing does (a 12-block ViT: its activations, not the data set held, fill the budget):
// the estimate names the cheapest configuration, and real steps there, started by
// plugins.oom_backoff.start_checkpointed_blocks, run inside the budget without an out-of-memory
// error.
TEST(EstimateLadder, TheCheapestConfigurationThatFitsRunsUnderTheBudgetWithoutRunningOutOfMemory) {
  TempDir tmp;
  const std::vector<std::string> overrides = {"model=vit_tiny", "model.num_layers=12",
                                              "plugins.oom_backoff.min_micro_batch=64"};
  MemoryEstimate e = trainer::tune::estimate_memory(ladder_request(tmp, overrides));
  ASSERT_EQ(e.min_micro_batch, 64);
  ASSERT_EQ(e.model_blocks, 12);
  const double plain = double(e.predict_on_rung(128, 64, 0, 0)), all = double(e.predict_on_rung(128, 64, 12, 0));
  // A budget whose usable part lies 30 % of the way from the every-block peak to the plain one
  // at micro-batch 64: the plain steps there need more than the whole limit when every block
  // checkpointed holds less than 0.8 of them (0.9 - 0.3 of the way, less 10 % for the
  // prediction's error).
  ASSERT_LT(all, 0.70 * plain);
  const double limit_mb = (all + 0.3 * (plain - all)) / (1.0 - e.margin) / kLadderMiB;
  e.limit = std::llround(limit_mb * kLadderMiB);
  e.limit_source = "memory.limit_mb = " + std::to_string(limit_mb);
  // The time model pinned (a probe's timing is not a test's business): a block recomputed costs
  // more than a micro-step, so the fewest blocks that fit win.
  e.step_seconds = 0.1, e.micro_step_seconds = 0.001, e.sample_seconds = 0.001, e.checkpoint_sample_seconds = 0.01;
  e.cheapest = e.cheapest_fit(128, 128, 64);
  ASSERT_TRUE(e.cheapest.has_value());
  const auto c = *e.cheapest;
  std::int64_t fewest = 13;
  for (std::int64_t k = 12; k >= 0; --k) {
    for (std::int64_t m = 64; m <= 128; ++m) {
      if (double(e.rung_limit_measure(128, m, k, 0)) <= double(e.limit) * (1.0 - e.margin)) fewest = k;
    }
  }
  EXPECT_EQ(c.checkpointed_blocks, fewest);
  EXPECT_GT(c.checkpointed_blocks, 0);
  EXPECT_LT(c.checkpointed_blocks, 12);
  EXPECT_GE(c.micro_batch, 64);
  EXPECT_EQ(128 % c.micro_batch, 0) << "the batch split evenly";
  EXPECT_EQ(c.moment_bits, 0);
  EXPECT_GT(c.time_ratio, 1.0);
  EXPECT_LE(c.peak, std::llround(double(e.limit) * (1.0 - e.margin)));
  // Nothing without a saver fits down to the floor.
  for (std::int64_t m = 64; m <= 128; ++m) EXPECT_FALSE(e.fits_at(128, m)) << m;
  std::ostringstream text;
  trainer::tune::print_estimate(e, text);
  EXPECT_NE(text.str().find("cheapest step that fits (micro-batches 64 to 128, the rungs above): micro-batch " +
                            std::to_string(c.micro_batch) + " with " + std::to_string(c.checkpointed_blocks) +
                            " of 12 blocks checkpointed: est. "),
            std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("12 of 12 blocks checkpointed"), std::string::npos) << text.str();

  // Real steps there, inside the budget, oom_backoff starting on the rung.
  trainer::tune::ShortRunSpec spec;
  spec.recipe = kLadderRecipe;
  spec.overrides = overrides;
  spec.overrides.push_back("memory.limit_mb=" + std::to_string(limit_mb));
  spec.overrides.push_back("plugins.oom_backoff.grow_after=0");  // stays on the rung
  spec.overrides.push_back("plugins.oom_backoff.start_checkpointed_blocks=" + std::to_string(c.checkpointed_blocks));
  spec.batch_size = 128;
  spec.micro_batch = c.micro_batch;
  spec.keep_budget = true;
  spec.keep_oom_backoff = true;
  spec.steps = 4;
  spec.work_dir = tmp / "on-the-rung";
  const auto r = trainer::tune::run_short(spec);
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_FALSE(r.out_of_memory) << "predicted " << c.peak << " B within " << e.limit << " B";
  EXPECT_EQ(r.checkpointed_blocks, c.checkpointed_blocks);
  EXPECT_EQ(r.steps.size(), 4u);
  for (const auto& s : r.steps) EXPECT_EQ(s.micro_batch, c.micro_batch);
  EXPECT_LE(r.peak(), e.limit);

  // The same run plain at micro-batch 64 does run out of memory: the budget is a real one.
  spec.overrides.back() = "plugins.oom_backoff.start_checkpointed_blocks=0";
  spec.micro_batch = 64;  // oom_backoff's floor: no smaller micro-batch would be tried
  spec.keep_oom_backoff = false;
  spec.work_dir = tmp / "plain";
  EXPECT_TRUE(trainer::tune::run_short(spec).out_of_memory);
}

// AdamW's moments in fewer bits are probed only where the recipe allows inexact rungs; each
// changes what is held by the state it saves, predicted against real steps in those bits.
TEST(EstimateLadder, MomentRungsAreProbedWithAllowInexactAndPredictTheirPeak) {
  TempDir tmp;
  const std::vector<std::string> mlp = {"model=mlp", "model.hidden=[1024, 1024]",
                                        "plugins.oom_backoff.allow_inexact=true"};
  const MemoryEstimate e = trainer::tune::estimate_memory(ladder_request(tmp, mlp));
  EXPECT_EQ(e.model_blocks, 0) << "an MLP has no blocks to checkpoint";
  ASSERT_EQ(e.moment_rungs.size(), 2u);
  EXPECT_EQ(e.moment_rungs[0].bits, 16);
  EXPECT_EQ(e.moment_rungs[1].bits, 8);
  // AdamW's state is two fp32 moments per parameter: 16 bits hold half, 8 bits about a quarter.
  const double state = double(e.optimizer_state);
  EXPECT_LT(e.moment_rungs[0].held_delta, -0.4 * state);
  EXPECT_LT(e.moment_rungs[1].held_delta, e.moment_rungs[0].held_delta);
  ASSERT_EQ(e.rungs.size(), 3u);
  EXPECT_TRUE(e.rungs[1].inexact);
  for (const int bits : {16, 8}) {
    const auto r = ladder_run(mlp, 128, 128, tmp / ("bits" + std::to_string(bits)), 0, bits);
    ASSERT_EQ(r.exit_code, 0) << r.message;
    EXPECT_EQ(r.moment_bits, bits);
    const double predicted = double(e.predict_on_rung(128, 128, 0, bits)), measured = double(r.peak());
    EXPECT_LT(std::fabs(predicted - measured) / measured, 0.10)
        << bits << " bits: predicted " << predicted << ", measured " << measured;
  }
  // The offload rung is in the default ladder but a GPU's: not probed on the CPU.
  for (const auto& r : e.moment_rungs) EXPECT_FALSE(r.offload);
  for (const auto& p : e.probes) EXPECT_FALSE(p.offload);
  // Without allow_inexact: none.
  const MemoryEstimate exact =
      trainer::tune::estimate_memory(ladder_request(tmp, {"model=mlp", "model.hidden=[1024, 1024]"}));
  EXPECT_TRUE(exact.moment_rungs.empty());
  EXPECT_FALSE(exact.has_ladder());
  ASSERT_EQ(exact.rungs.size(), 1u) << "the recipe's own configuration only";
}

// The offload rung's probe, as a GPU's estimate runs it: AdamW's moments offloaded from the first
// step on. On the CPU nothing moves (the moments are in host memory already), but the core takes
// the request and streams the step through its copies, so the probe's plumbing runs here: the run
// reports the moments offloaded, in the recipe's 32 bits, as many bytes of them as the plain
// probe's.
TEST(EstimateLadder, TheOffloadProbeRunsItsStepsWithTheMomentsOffloaded) {
  TempDir tmp;
  const std::vector<std::string> mlp = {"model=mlp", "model.hidden=[1024, 1024]"};
  trainer::tune::ShortRunSpec spec;
  spec.recipe = kLadderRecipe;
  spec.overrides = mlp;
  spec.batch_size = spec.micro_batch = 64;
  spec.steps = 3;
  spec.work_dir = tmp / "plain";
  const auto plain = trainer::tune::run_short(spec);
  ASSERT_EQ(plain.exit_code, 0) << plain.message;
  EXPECT_FALSE(plain.optimizer_offload);
  spec.offload = true;
  spec.work_dir = tmp / "offload";
  const auto off = trainer::tune::run_short(spec);
  ASSERT_EQ(off.exit_code, 0) << off.message;
  ASSERT_EQ(off.steps.size(), 3u);
  EXPECT_TRUE(off.optimizer_offload);
  EXPECT_EQ(off.moment_bits, 32);
  EXPECT_GT(plain.optimizer_bytes, 0);
  EXPECT_EQ(off.optimizer_bytes, plain.optimizer_bytes);
  // SGD has no moments: the core refuses, and the probe says so (an estimate leaves the rung out).
  spec.overrides = {"model=mlp", "optim=sgd"};
  spec.work_dir = tmp / "sgd";
  const auto sgd = trainer::tune::run_short(spec);
  ASSERT_EQ(sgd.exit_code, 0) << sgd.message;
  EXPECT_FALSE(sgd.optimizer_offload);
}

// oom_backoff's start keys: what the model or the optimizer cannot do is a usage error.
TEST(EstimateLadder, StartKeysThatCannotApplyAreUsageErrors) {
  TempDir tmp;
  // More blocks than the model has: the run stops before its first step (exit code 2).
  trainer::tune::ShortRunSpec spec;
  spec.recipe = kLadderRecipe;
  spec.overrides = kLadderVit;
  spec.overrides.push_back("plugins.oom_backoff.start_checkpointed_blocks=7");
  spec.keep_oom_backoff = true;
  spec.batch_size = spec.micro_batch = 8;
  spec.work_dir = tmp / "blocks";
  auto r = trainer::tune::run_short(spec);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("start_checkpointed_blocks = 7: the model has 6 blocks"), std::string::npos) << r.message;
  EXPECT_TRUE(r.steps.empty());
  // Moments in fewer bits without allow_inexact: refused as the plugin is configured (the same
  // exit code 2, before any step).
  spec.overrides.back() = "plugins.oom_backoff.start_moment_bits=16";
  spec.work_dir = tmp / "bits";
  r = trainer::tune::run_short(spec);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("set plugins.oom_backoff.allow_inexact = true too"), std::string::npos) << r.message;
  EXPECT_TRUE(r.steps.empty());
  // adamw8bit's moments are in 8 bits already: 16 would be more, not a saver.
  spec.overrides = {"model=mlp", "optim=adamw8bit", "plugins.oom_backoff.allow_inexact=true",
                    "plugins.oom_backoff.start_moment_bits=16"};
  spec.work_dir = tmp / "more";
  r = trainer::tune::run_short(spec);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("keeps its moments in 8 bits already"), std::string::npos) << r.message;
  // SGD has no moments to shrink.
  spec.overrides = {"model=mlp", "optim=sgd", "plugins.oom_backoff.allow_inexact=true",
                    "plugins.oom_backoff.start_moment_bits=8"};
  spec.work_dir = tmp / "sgd";
  r = trainer::tune::run_short(spec);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("start_moment_bits = 8: the optimizer's moments cannot change"), std::string::npos)
      << r.message;
  // The moments in host memory: on the CPU they are there already.
  spec.overrides = {"model=mlp", "plugins.oom_backoff.start_offload=true"};
  spec.work_dir = tmp / "offload";
  r = trainer::tune::run_short(spec);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("start_offload = true: the run is on the CPU, whose memory is the host's"),
            std::string::npos)
      << r.message;
  EXPECT_TRUE(r.steps.empty());
}

}  // namespace
