// Data-parallel runs when something goes wrong on one rank: out of memory on rank 1 only (its
// own memory.limit_mb), a rank killed or hung. The ranks are started by hand with torchrun's
// variables, so each can have its own overrides.
#include <gtest/gtest.h>

#include <csignal>
#include <regex>

#include "dist/dp_util.h"
#include "support/test_util.h"
#include "trainer/distributed.h"

namespace {

using trainer::testing::Child;
using trainer::testing::exit_code_within;
using trainer::testing::expect_same_losses;
using trainer::testing::largest_difference;
using trainer::testing::metric_by_step;
using trainer::testing::rank_env;
using trainer::testing::read_file;
using trainer::testing::TempDir;
using trainer::testing::write_file;

/// A CNN without BatchNorm and dropout (its activations dominate a step's memory, so the
/// micro-batch decides whether a step fits) on 640 Fashion-MNIST images in global batches of
/// 64, with oom_backoff growing back after 3 clean steps and memory_log's summary. Buckets of
/// 50 KiB (5 of them): the all-reduce of the first ones starts inside the backward.
std::string recipe(const TempDir& tmp) {
  const std::string path = tmp / "dp.toml";
  write_file(path, R"(defaults = ["model/cnn", "dataset/fashion_mnist", "optim/adamw"]
[run]
name = "dp"
seed = 7
[model]
batch_norm = false
dropout = 0.0
memory_format = "contiguous"
[training]
epochs = 1
batch_size = 64
log_every = 1
[dataset]
limit = 640
eval_limit = 200
[eval]
batch_size = 50
[runtime]
num_threads = 1
[metrics]
console = false
[distributed]
bucket_mb = 0.05
[plugins]
load = ["oom_backoff", "memory_log"]
[plugins.oom_backoff]
grow_after = 3
)");
  return path;
}

struct Ranks {
  Ranks(const std::string& recipe, const std::string& dir, const std::string& rank0_args,
        const std::string& rank1_args) {
    const int port = trainer::free_loopback_port();
    const std::string cmd = std::string("env TRAINER_CONFIG_PATH=") + TRAINER_SOURCE_DIR + "/configs ";
    const std::string run = std::string(TRAINER_CLI) + " --recipe " + recipe + " --run-dir " + dir + " ";
    r0.emplace(cmd + rank_env(0, 2, port) + run + rank0_args + " > " + dir + ".r0 2>&1");
    r1.emplace(cmd + rank_env(1, 2, port) + run + rank1_args + " > " + dir + ".r1 2>&1");
  }
  std::optional<Child> r0, r1;
};

/// memory_log's summary on a rank: the peak and how far it is above the memory at the start
/// of training (MiB).
std::pair<double, double> peak_and_step(const std::string& log) {
  std::smatch m;
  const std::string text = read_file(log);
  EXPECT_TRUE(std::regex_search(
      text, m, std::regex("peak ([0-9.]+) MiB allocated, [0-9.]+ MiB while training \\(([0-9.]+) MiB above")))
      << log;
  return m.empty() ? std::make_pair(0.0, 0.0) : std::make_pair(std::stod(m[1]), std::stod(m[2]));
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

/// How many of a run's first steps (run directory `dir`, `steps` steps) took their gradients in
/// micro-batches of `before`, all the others taking theirs in micro-batches of `after`: the split
/// a bit-for-bit comparison needs. -1 when the sizes are not of that shape.
long steps_before_the_drop(const std::string& dir, std::size_t steps, double before, double after) {
  const auto sizes = metric_by_step(dir + "/metrics.jsonl", "train/micro_batch_size");
  EXPECT_EQ(sizes.size(), steps) << dir;
  long k = 0;
  for (const auto& [step, size] : sizes) {
    if (size == before && k == step - 1)
      k = step;
    else if (size != after)
      return -1;
  }
  return sizes.size() == steps ? k : -1;
}

TEST(DataParallelFailures, OutOfMemoryOnOneRankIsRecoveredByEveryRankTogether) {
  TempDir tmp;
  const std::string r = recipe(tmp);
  {
    // A checkpoint after every step: the start of the reference runs below.
    const std::string every = "checkpoint.every_steps=1 checkpoint.keep_last=10";
    Ranks clean(r, tmp / "clean", every, every);
    ASSERT_EQ(exit_code_within(*clean.r0, std::chrono::seconds(300)), 0) << read_file(tmp / "clean.r0");
    ASSERT_EQ(exit_code_within(*clean.r1, std::chrono::seconds(60)), 0) << read_file(tmp / "clean.r1");
  }
  // Rank 1's budget: 85 % of the way from its memory at the start of training to its peak,
  // which a full micro-batch of 32 crosses and one of 16 does not.
  const auto [peak, step] = peak_and_step(tmp / "clean/rank-1.log");
  ASSERT_GT(step, 4.0);
  const double limit = peak - 0.15 * step;
  Ranks tight(r, tmp / "tight", "", "memory.limit_mb=" + std::to_string(limit));
  ASSERT_EQ(exit_code_within(*tight.r0, std::chrono::seconds(300)), 0) << read_file(tmp / "tight.r0");
  ASSERT_EQ(exit_code_within(*tight.r1, std::chrono::seconds(60)), 0) << read_file(tmp / "tight.r1");
  const std::string log0 = read_file(tmp / "tight/trainer.log"), log1 = read_file(tmp / "tight/rank-1.log");
  // Rank 1 ran out of memory itself; rank 0 heard of it; both retried every time, alike.
  EXPECT_NE(log1.find("on this rank (1): CPU out of memory"), std::string::npos) << log1;
  EXPECT_NE(log0.find("rank 1 ran out of memory in "), std::string::npos) << log0;
  const std::size_t retries = count(log1, "retrying the same batch with micro-batches of");
  EXPECT_GE(retries, 1u) << log1;
  EXPECT_EQ(count(log0, "retrying the same batch with micro-batches of"), retries) << log0;
  EXPECT_NE(read_file(tmp / "tight/status.json").find("\"status\":\"FINISHED\""), std::string::npos);
  // After 3 clean steps both grow back together (toward 32; whether 24 fits depends on the
  // kernels' workspace on this CPU). The same samples in the same global batches as the run
  // without out-of-memory errors: the same losses, up to the order of the sums (smaller
  // micro-batches sum in another order; AdamW turns those last-bit differences in near-zero
  // gradients into steps of +-lr, so the models are compared below, on the same split).
  const std::size_t grows = count(log1, "clean steps, growing back");
  EXPECT_GE(grows, 1u) << log1;
  EXPECT_EQ(count(log0, "clean steps, growing back"), grows) << log0;
  expect_same_losses(tmp / "clean", tmp / "tight", 10);

  // A budget the backward crosses after the all-reduce of its first buckets started on both
  // ranks: rank 1 starts the rest as they are, and both drop the attempt and retry together.
  const std::string no_grow = "plugins.oom_backoff.grow_after=0 ";
  Ranks inside(r, tmp / "inside", no_grow, no_grow + "memory.limit_mb=" + std::to_string(peak - 0.03 * step));
  ASSERT_EQ(exit_code_within(*inside.r0, std::chrono::seconds(300)), 0) << read_file(tmp / "inside.r0");
  ASSERT_EQ(exit_code_within(*inside.r1, std::chrono::seconds(60)), 0) << read_file(tmp / "inside.r1");
  const std::string inside1 = read_file(tmp / "inside/rank-1.log");
  EXPECT_TRUE(std::regex_search(inside1, std::regex("all-reduce: [1-9][0-9]* of 5 buckets started inside the "
                                                    "backward before it failed")))
      << inside1;
  EXPECT_NE(read_file(tmp / "inside/trainer.log").find("rank 1 ran out of memory in backward"), std::string::npos);
  // Without growing back, the first k steps fit micro-batches of 32 (the first step needs less:
  // no optimizer state yet) and every later one ends in micro-batches of 16. The failed attempts
  // (their forwards, backwards and buckets already reduced) leave nothing behind: the run is,
  // bit for bit, the clean run's first k steps followed by steps in micro-batches of 16.
  const long k = steps_before_the_drop(tmp / "inside", 10, 32, 16);
  ASSERT_GE(k, 0) << read_file(tmp / "inside/metrics.jsonl");
  ASSERT_LT(k, 10);
  const std::string halves = "training.micro_batch_size=16" + (k == 0 ? std::string()
                                                                      : " --resume " + (tmp / "clean/checkpoints/") +
                                                                            "step_0000000" + std::to_string(k) + ".pt");
  {
    Ranks reference(r, tmp / "reference", halves, halves);
    ASSERT_EQ(exit_code_within(*reference.r0, std::chrono::seconds(300)), 0) << read_file(tmp / "reference.r0");
    ASSERT_EQ(exit_code_within(*reference.r1, std::chrono::seconds(60)), 0) << read_file(tmp / "reference.r1");
  }
  const auto losses = metric_by_step(tmp / "inside/metrics.jsonl", "train/loss");
  const auto clean_losses = metric_by_step(tmp / "clean/metrics.jsonl", "train/loss");
  const auto reference_losses = metric_by_step(tmp / "reference/metrics.jsonl", "train/loss");
  EXPECT_EQ(reference_losses.size(), static_cast<std::size_t>(10 - k));
  for (const auto& [s, loss] : losses) {
    EXPECT_EQ(loss, s <= k ? clean_losses.at(s) : reference_losses.at(s)) << "step " << s;
  }
  EXPECT_EQ(
      largest_difference(tmp / "reference/checkpoints/step_00000010.pt", tmp / "inside/checkpoints/step_00000010.pt"),
      0.0);

  // Below what any micro-batch needs: rank 1 gives up, and every rank fails with it.
  Ranks hopeless(r, tmp / "hopeless", "", "memory.limit_mb=" + std::to_string(peak - step + 1.0));
  EXPECT_EQ(exit_code_within(*hopeless.r0, std::chrono::seconds(300)), 3) << read_file(tmp / "hopeless.r0");
  EXPECT_EQ(exit_code_within(*hopeless.r1, std::chrono::seconds(60)), 3) << read_file(tmp / "hopeless.r1");
  const std::string status = read_file(tmp / "hopeless/status.json");
  EXPECT_NE(status.find("\"status\":\"FAILED\""), std::string::npos) << status;
  EXPECT_NE(status.find("out of memory in "), std::string::npos) << status;
  EXPECT_NE(status.find("rank 1 ran out of memory"), std::string::npos) << status;

  // Evaluation: each rank retries its own part; rank 1 giving up (no eval backoff) ends the
  // run on every rank.
  Ranks eval(r, tmp / "eval", "eval.batch_size=1000 plugins.oom_backoff.eval=false",
             "eval.batch_size=1000 plugins.oom_backoff.eval=false memory.limit_mb=" + std::to_string(peak + 1.0));
  EXPECT_EQ(exit_code_within(*eval.r0, std::chrono::seconds(300)), 3) << read_file(tmp / "eval.r0");
  EXPECT_EQ(exit_code_within(*eval.r1, std::chrono::seconds(60)), 3) << read_file(tmp / "eval.r1");
  const std::string eval_status = read_file(tmp / "eval/status.json");
  EXPECT_NE(eval_status.find("rank 1 ran out of memory in eval and gave up"), std::string::npos) << eval_status;
}

// The memory ladder's checkpoint rung in a data-parallel run: rank 1 alone runs out of memory
// (its own budget), its ladder checkpoints blocks, and every rank checkpoints as many (the ranks
// agree on the most blocks with the micro-batch, so their forwards stay alike). Checkpointing is
// exact: the same micro-batches, the same losses as the run without a budget, and the same
// model bit for bit.
TEST(DataParallelFailures, ACheckpointRungTakenOnOneRankIsTakenOnEveryRankAlike) {
  TempDir tmp;
  // recipe()'s run with the tiny ViT (4 blocks, no dropout) in place of the CNN.
  std::string text = read_file(recipe(tmp));
  const auto swap = [&text](const std::string& from, const std::string& to) {
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  };
  swap("\"model/cnn\"", "\"model/vit_tiny\"");
  swap("batch_norm = false\ndropout = 0.0\nmemory_format = \"contiguous\"\n", "dropout = 0.0\n");
  const std::string r = tmp / "vit.toml";
  write_file(r, text);
  const std::string ladder =
      R"('+plugins.oom_backoff.ladder=["checkpoint", "micro_batch"]' plugins.oom_backoff.grow_after=0 )";
  const std::string every = ladder + "checkpoint.every_steps=10";
  {
    Ranks clean(r, tmp / "clean", every, every);
    ASSERT_EQ(exit_code_within(*clean.r0, std::chrono::seconds(300)), 0) << read_file(tmp / "clean.r0");
    ASSERT_EQ(exit_code_within(*clean.r1, std::chrono::seconds(60)), 0) << read_file(tmp / "clean.r1");
  }
  // Rank 1's budget: 20 % of its step's own memory below its peak; every block checkpointed
  // saves more than that (the ViT's activations are most of its step).
  const auto [peak, step] = peak_and_step(tmp / "clean/rank-1.log");
  ASSERT_GT(step, 2.0);
  Ranks tight(r, tmp / "tight", every, every + " memory.limit_mb=" + std::to_string(peak - 0.2 * step));
  ASSERT_EQ(exit_code_within(*tight.r0, std::chrono::seconds(300)), 0) << read_file(tmp / "tight.r0");
  ASSERT_EQ(exit_code_within(*tight.r1, std::chrono::seconds(60)), 0) << read_file(tmp / "tight.r1");
  const std::string log0 = read_file(tmp / "tight/trainer.log"), log1 = read_file(tmp / "tight/rank-1.log");
  EXPECT_NE(log1.find("on this rank (1): CPU out of memory"), std::string::npos) << log1;
  EXPECT_NE(log1.find("oom_backoff: rung checkpoint"), std::string::npos) << log1;
  // Every rank switched the same blocks on, the same number of times.
  const std::regex switched("activation checkpointing: ([0-9]+) -> ([0-9]+) of 4 blocks checkpointed");
  std::vector<std::string> on0, on1;
  for (std::sregex_iterator i(log0.begin(), log0.end(), switched), end; i != end; ++i) on0.push_back((*i)[0]);
  for (std::sregex_iterator i(log1.begin(), log1.end(), switched), end; i != end; ++i) on1.push_back((*i)[0]);
  EXPECT_FALSE(on1.empty()) << log1;
  EXPECT_EQ(on0, on1) << log0;
  const auto status = read_file(tmp / "tight/status.json");
  EXPECT_TRUE(std::regex_search(status, std::regex("\"checkpointed_blocks\":[1-4]"))) << status;
  // The micro-batch stayed whole on both ranks (the checkpoint rung came first and sufficed).
  const auto sizes = metric_by_step(tmp / "tight/metrics.jsonl", "train/micro_batch_size");
  for (const auto& [s, size] : sizes) EXPECT_EQ(size, 32.0) << "step " << s;
  expect_same_losses(tmp / "clean", tmp / "tight", 10);
  EXPECT_EQ(largest_difference(tmp / "clean/checkpoints/step_00000010.pt", tmp / "tight/checkpoints/step_00000010.pt"),
            0.0);
}

/// The step a status.json reports, and the step of its last checkpoint (-1 when none).
std::pair<long, long> status_steps(const std::string& status) {
  std::smatch g, c;
  const bool has_step = std::regex_search(status, g, std::regex("\"global_step\":([0-9]+)"));
  const bool has_ckpt = std::regex_search(status, c, std::regex("step_([0-9]+)\\.pt"));
  return {has_step ? std::stol(g[1]) : -1, has_ckpt ? std::stol(c[1]) : -1};
}

/// Rank `lost` gets `sig` in the middle of a long run with a 3 s timeout: the other rank exits
/// with 3 and names it.
void lose_a_rank(const TempDir& tmp, int lost, int sig, const std::string& dir) {
  Ranks ranks(recipe(tmp), tmp / dir, "training.epochs=1000 distributed.timeout_s=3 checkpoint.every_steps=7",
              "training.epochs=1000 distributed.timeout_s=3");
  ASSERT_TRUE(trainer::testing::wait_for_text(tmp / (dir + "/metrics.jsonl"), "train/loss", std::chrono::seconds(120)))
      << read_file(tmp / (dir + ".r0"));
  Child& victim = lost == 1 ? *ranks.r1 : *ranks.r0;
  Child& survivor = lost == 1 ? *ranks.r0 : *ranks.r1;
  ASSERT_EQ(::kill(victim.pid(), sig), 0);
  // The timeout (3 s) and the roll call of the heartbeats (1.25 s) bound the wait; 60 s only
  // keeps a hang from hanging the test.
  const std::string out = tmp / (dir + (lost == 1 ? ".r0" : ".r1"));
  EXPECT_EQ(exit_code_within(survivor, std::chrono::seconds(60)), 3) << read_file(out);
  if (lost == 0) {
    // The store went with rank 0; rank 1 says so (rank 0 writes the run's files, not rank 1).
    EXPECT_NE(read_file(out).find("the group's store does not answer: rank 0"), std::string::npos) << read_file(out);
    return;
  }
  const std::string status = read_file(tmp / (dir + "/status.json"));
  EXPECT_NE(status.find("\"status\":\"FAILED\""), std::string::npos) << status;
  EXPECT_NE(status.find("rank 1 stopped answering (died, killed or stopped)"), std::string::npos) << status;
  // Rank 0 kept the run: a final checkpoint of the last step every rank took (not only the
  // last one due by checkpoint.every_steps).
  const auto [step, checkpointed] = status_steps(status);
  EXPECT_GT(step, 0) << status;
  EXPECT_EQ(checkpointed, step) << status;
  EXPECT_FALSE(read_file(tmp / (dir + "/checkpoints/latest")).empty());
}

TEST(DataParallelFailures, ARankAliveButStuckOutsideTheCollectivesIsNamedAfterTheTimeout) {
  // Rank 1 sleeps 8 s in BatchEnd of step 3 (the test plugin stall) while its heartbeat goes on:
  // rank 0 waits the 2 s timeout in its next collective, then names rank 1 as alive elsewhere.
  TempDir tmp;
  const std::string args = std::string("training.epochs=1000 distributed.timeout_s=2 --plugin-dir ") +
                           TRAINER_TEST_PLUGIN_DIR +
                           " 'plugins.load=[\"oom_backoff\", \"memory_log\", \"stall\"]' plugins.stall.seconds=8";
  Ranks ranks(recipe(tmp), tmp / "stall", args, args);
  EXPECT_EQ(exit_code_within(*ranks.r0, std::chrono::seconds(120)), 3) << read_file(tmp / "stall.r0");
  const std::string status = read_file(tmp / "stall/status.json");
  EXPECT_NE(status.find("\"status\":\"FAILED\""), std::string::npos) << status;
  EXPECT_TRUE(std::regex_search(
      status, std::regex("failed: rank 1 \\([0-9]+ collectives started, this rank [0-9]+\\) is alive but not at this "
                         "collective: busy or stuck outside the collectives")))
      << status;
  EXPECT_EQ(status_steps(status).first, 3) << status;
  // Rank 1 wakes to a group without rank 0 and ends too.
  EXPECT_EQ(exit_code_within(*ranks.r1, std::chrono::seconds(60)), 3) << read_file(tmp / "stall.r1");
}

// A NaN in one rank's backward reaches every rank's summed gradients; the ranks agree on the
// verdict before the optimizer step, so that a rank that would only skip the step (a plugin
// asked it) fails with the one that found the NaN instead of waiting for it in a collective.
TEST(DataParallelFailures, ADivergenceOnOneRankEndsEveryRankAsDiverged) {
  TempDir tmp;
  const std::string args = std::string("--plugin-dir ") + TRAINER_TEST_PLUGIN_DIR +
                           " 'plugins.load=[\"nonfinite\"]' plugins.nonfinite.rank=1 plugins.nonfinite.skip_rank=0";
  Ranks ranks(recipe(tmp), tmp / "nan", args, args);
  EXPECT_EQ(exit_code_within(*ranks.r0, std::chrono::seconds(120)), 3) << read_file(tmp / "nan.r0");
  EXPECT_EQ(exit_code_within(*ranks.r1, std::chrono::seconds(60)), 3) << read_file(tmp / "nan.r1");
  const std::string status = read_file(tmp / "nan/status.json");
  EXPECT_NE(status.find("\"failure\":\"diverged\""), std::string::npos) << status;
  EXPECT_NE(status.find("training diverged at step 3 (epoch 1, batch 3): another rank found a NaN or infinite loss "
                        "or gradient"),
            std::string::npos)
      << status;
  EXPECT_NE(read_file(tmp / "nan.r1").find("training diverged at step 3 (epoch 1, batch 3): the gradient norm is NaN"),
            std::string::npos)
      << read_file(tmp / "nan.r1");
  EXPECT_EQ(status_steps(status).first, 2) << status;
}

// training.on_nonfinite = "skip_step" with weights that give a non-finite loss on every batch:
// the ranks agree on each skip, so they count alike and fail together, past
// training.max_skipped_steps (10) in a row, as diverged.
TEST(DataParallelFailures, RanksThatKeepSkippingStepsFailTogetherAsDiverged) {
  TempDir tmp;
  const std::string args = "training.on_nonfinite=\"skip_step\" optim.lr=1e30 training.batch_size=32";
  Ranks ranks(recipe(tmp), tmp / "dead", args, args);
  EXPECT_EQ(exit_code_within(*ranks.r0, std::chrono::seconds(120)), 3) << read_file(tmp / "dead.r0");
  EXPECT_EQ(exit_code_within(*ranks.r1, std::chrono::seconds(60)), 3) << read_file(tmp / "dead.r1");
  const std::string status = read_file(tmp / "dead/status.json");
  EXPECT_NE(status.find("\"failure\":\"diverged\""), std::string::npos) << status;
  EXPECT_NE(status.find("\"skipped_steps\":11,\"skipped_in_a_row\":11"), std::string::npos) << status;
  for (const char* rank : {"dead.r0", "dead.r1"}) {
    EXPECT_NE(read_file(tmp / rank).find("training diverged: 11 optimizer steps in a row skipped"), std::string::npos)
        << read_file(tmp / rank);
  }
  EXPECT_EQ(status_steps(status).first, 1) << status;
}

TEST(DataParallelFailures, AKilledRankMakesTheOthersFailNamingIt) {
  TempDir tmp;
  lose_a_rank(tmp, 1, SIGKILL, "killed");
}

TEST(DataParallelFailures, AStoppedRankMakesTheOthersFailAfterTheTimeoutNamingIt) {
  TempDir tmp;
  lose_a_rank(tmp, 1, SIGSTOP, "stopped");
}

TEST(DataParallelFailures, AStoppedRankZeroTakesTheStoreWithItAndTheOthersStillEnd) {
  TempDir tmp;
  lose_a_rank(tmp, 0, SIGSTOP, "stopped0");
}

}  // namespace
