// Data-parallel training end to end: `trainer launch --nproc 2` (Gloo over 127.0.0.1, one
// thread per rank) against one process with the same global batch, on a slice of the real
// Fashion-MNIST with the MLP (no dropout, no BatchNorm: the ranks' runs are the one run's).
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <sys/types.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include "dist/dp_util.h"
#include "support/test_util.h"

namespace {

using trainer::testing::expect_same_training;
using trainer::testing::largest_difference;
using trainer::testing::metric_by_step;
using trainer::testing::read_file;
using trainer::testing::read_lines;
using trainer::testing::run_command;
using trainer::testing::TempDir;
using trainer::testing::write_file;

/// 640 training images in global batches of 64 (10 steps an epoch), 2 epochs, evaluated on 300
/// test images after each; every micro-batch's dataset indices recorded. Micro-batches of 32: a
/// run of one process computes the same parts of each batch as two ranks do, so the two train
/// the same model bit for bit (a part of another size sums in another order, by ~1e-7, which
/// AdamW turns into steps of +-lr on near-zero gradients).
std::string recipe(const TempDir& tmp) {
  const std::string path = tmp / "dp.toml";
  write_file(path, R"(defaults = ["model/mlp", "dataset/fashion_mnist", "optim/adamw"]
[run]
name = "dp"
seed = 7
[training]
epochs = 2
batch_size = 64
micro_batch_size = 32
log_every = 1
[dataset]
limit = 640
eval_limit = 300
[eval]
every_epochs = 1
batch_size = 100
[runtime]
num_threads = 1
[metrics]
console = false
[plugins]
load = ["recording"]
[plugins.recording]
indices = true
events = ["BeforeForward"]
)");
  return path;
}

std::string trainer_cmd() {
  return std::string("TRAINER_CONFIG_PATH=") + TRAINER_SOURCE_DIR + "/configs " + TRAINER_CLI;
}

/// Dataset indices of each epoch, from recorded BeforeForward lines.
std::map<int, std::multiset<long>> indices_by_epoch(const std::string& events) {
  std::map<int, std::multiset<long>> out;
  const std::regex epoch("\"epoch\":([0-9]+)"), list("\"indices\":\\[([0-9,]*)\\]");
  for (const auto& line : read_lines(events)) {
    std::smatch e, l;
    if (!std::regex_search(line, e, epoch) || !std::regex_search(line, l, list)) continue;
    std::string s = l[1];
    for (std::size_t p = 0; p < s.size();) {
      const std::size_t q = s.find(',', p);
      out[std::stoi(e[1])].insert(std::stol(s.substr(p, q - p)));
      p = q == std::string::npos ? s.size() : q + 1;
    }
  }
  return out;
}

TEST(DataParallel, TwoRanksTrainAsOneProcessWithTheSameGlobalBatch) {
  TempDir tmp;
  const std::string r = recipe(tmp);
  auto one = run_command(trainer_cmd() + " --recipe " + r + " --run-dir " + (tmp / "one") + " --log-level warn");
  ASSERT_EQ(one.code, 0) << one.text;
  // Buckets of 50 KiB (4 for the MLP): the first ones' all-reduce starts inside the backward.
  auto two = run_command(trainer_cmd() + " launch --nproc 2 -- --recipe " + r +
                         " distributed.bucket_mb=0.05 --run-dir " + (tmp / "two"));
  ASSERT_EQ(two.code, 0) << two.text;
  EXPECT_TRUE(std::regex_search(read_file(tmp / "two/trainer.log"),
                                std::regex("all-reduce: [1-9][0-9]* of 4 buckets started inside the backward")))
      << read_file(tmp / "two/trainer.log");
  // The same run with the all-reduce after the backward: the same sums, the same bits.
  auto after = run_command(trainer_cmd() + " launch --nproc 2 -- --recipe " + r +
                           " distributed.bucket_mb=0.05 distributed.overlap=false --run-dir " + (tmp / "after"));
  ASSERT_EQ(after.code, 0) << after.text;
  EXPECT_EQ(read_file(tmp / "after/trainer.log").find("started inside the backward"), std::string::npos);
  EXPECT_EQ(largest_difference(tmp / "two/checkpoints/step_00000020.pt", tmp / "after/checkpoints/step_00000020.pt"),
            0.0);

  // The loss of every step and the evaluations: the same run (float sums in another order).
  const auto loss1 = metric_by_step(tmp / "one/metrics.jsonl", "train/loss");
  const auto loss2 = metric_by_step(tmp / "two/metrics.jsonl", "train/loss");
  ASSERT_EQ(loss1.size(), 20u);
  ASSERT_EQ(loss2.size(), loss1.size());
  for (const auto& [step, v] : loss1) EXPECT_NEAR(loss2.at(step), v, 1e-4 * std::fabs(v)) << "step " << step;
  for (const char* m : {"eval/accuracy", "eval/loss"}) {
    const auto a = metric_by_step(tmp / "one/metrics.jsonl", m), b = metric_by_step(tmp / "two/metrics.jsonl", m);
    ASSERT_EQ(a.size(), 2u) << m;
    for (const auto& [step, v] : a) EXPECT_NEAR(b.at(step), v, 1e-4 * std::fabs(v)) << m << " at " << step;
  }
  // The final parameters: rank 0's checkpoint is the one process's, bit for bit.
  EXPECT_EQ(largest_difference(tmp / "one/checkpoints/step_00000020.pt", tmp / "two/checkpoints/step_00000020.pt"),
            0.0);

  // Every sample once per epoch, across the ranks; the ranks' parts do not overlap.
  const auto rank0 = indices_by_epoch(tmp / "two/events.jsonl"),
             rank1 = indices_by_epoch(tmp / "two/events-rank1.jsonl");
  for (int epoch : {0, 1}) {
    std::multiset<long> all = rank0.at(epoch);
    all.insert(rank1.at(epoch).begin(), rank1.at(epoch).end());
    EXPECT_EQ(all.size(), 640u) << "epoch " << epoch;
    EXPECT_EQ(std::set<long>(all.begin(), all.end()).size(), 640u) << "epoch " << epoch;
    EXPECT_EQ(rank0.at(epoch).size(), 320u);
  }

  // One run, one record: rank 0 writes the run's files; rank 1 its own log, each line tagged.
  EXPECT_NE(read_file(tmp / "two/status.json").find("\"status\":\"FINISHED\""), std::string::npos);
  EXPECT_NE(read_file(tmp / "two/trainer.log").find("[rank 0] data-parallel: rank 0 of 2, global batch 64"),
            std::string::npos);
  EXPECT_NE(read_file(tmp / "two/rank-1.log").find("[rank 1] data-parallel: rank 1 of 2"), std::string::npos);
}

/// Largest difference between the parameters of two checkpoints.
TEST(DataParallel, APluginsEvalMetricSummedOverTheGroupCoversEverySample) {
  TempDir tmp;
  const std::string args = " --recipe " + recipe(tmp) + " training.max_steps=3 eval.at_end=true --plugin-dir " +
                           TRAINER_TEST_PLUGIN_DIR + " 'plugins.load=[\"eval_count\"]' --log-level warn --run-dir ";
  auto o = run_command(trainer_cmd() + args + (tmp / "one"));
  ASSERT_EQ(o.code, 0) << o.text;
  o = run_command(trainer_cmd() + " launch --nproc 2 --" + args + (tmp / "two"));
  ASSERT_EQ(o.code, 0) << o.text;
  for (const char* run : {"one", "two"}) {
    const std::string metrics = tmp / (std::string(run) + "/metrics.jsonl");
    const auto samples = metric_by_step(metrics, "eval/plugin_samples");
    ASSERT_EQ(samples.size(), 1u) << run;
    EXPECT_EQ(samples.begin()->second, 300.0) << run;  // each rank saw 150; ctx.group summed them
    EXPECT_NEAR(metric_by_step(metrics, "eval/plugin_accuracy").begin()->second,
                metric_by_step(metrics, "eval/accuracy").begin()->second, 1e-12)
        << run;
  }
}

TEST(DataParallel, AGradientAccumulatedAgainAfterItsBucketStartedIsReducedAgain) {
  // A backward inside the backward (the test plugin reentrant_grad) accumulates into the head's
  // bias, alone in the first bucket (buckets of 1 KiB), which then starts its all-reduce; the
  // outer backward accumulates into it again. Every bucket is reduced again, so the model is
  // the one process's.
  TempDir tmp;
  const std::string args = " --recipe " + recipe(tmp) + " training.max_steps=6 --plugin-dir " +
                           TRAINER_TEST_PLUGIN_DIR + " 'plugins.load=[\"recording\", \"reentrant_grad\"]' --run-dir ";
  auto o = run_command(trainer_cmd() + args + (tmp / "one") + " --log-level warn");
  ASSERT_EQ(o.code, 0) << o.text;
  o = run_command(trainer_cmd() + " launch --nproc 2 --" + args + (tmp / "two") + " distributed.bucket_mb=0.001");
  ASSERT_EQ(o.code, 0) << o.text;
  const std::string log = read_file(tmp / "two/trainer.log");
  EXPECT_NE(log.find("a gradient was accumulated again after its bucket had started"), std::string::npos) << log;
  EXPECT_NE(log.find("buckets started inside the backward of the first overlapped step"), std::string::npos) << log;
  EXPECT_EQ(largest_difference(tmp / "one/checkpoints/step_00000006.pt", tmp / "two/checkpoints/step_00000006.pt"),
            0.0);
}

TEST(DataParallel, ARankWithoutSamplesInTheLastBatchStillJoinsTheOverlappedAllReduce) {
  // 641 images: the epoch's last global batch holds one sample, all on rank 0. Rank 1 runs no
  // backward (its hooks never fire) and starts every bucket after it, in the same order.
  TempDir tmp;
  const std::string args = " --recipe " + recipe(tmp) + " training.epochs=1 dataset.limit=641 --run-dir ";
  auto o = run_command(trainer_cmd() + args + (tmp / "one") + " --log-level warn");
  ASSERT_EQ(o.code, 0) << o.text;
  o = run_command(trainer_cmd() + " launch --nproc 2 --" + args + (tmp / "two") + " distributed.bucket_mb=0.05");
  ASSERT_EQ(o.code, 0) << o.text;
  expect_same_training(tmp / "one", tmp / "two", 11, "checkpoints/step_00000011.pt");
  const auto rank1 = indices_by_epoch(tmp / "two/events-rank1.jsonl");
  EXPECT_EQ(rank1.at(0).size(), 320u);  // 10 batches of 32, nothing of the last
}

TEST(DataParallel, APluginHandlingAfterBackwardKeepsTheAllReduceAfterTheBackward) {
  // recording without an events list handles every event, AfterBackward among them, where a
  // plugin may change the gradients (mixed_precision unscales them): nothing is sent before.
  TempDir tmp;
  auto o = run_command(trainer_cmd() + " launch --nproc 2 -- --recipe " + recipe(tmp) +
                       " training.max_steps=3 distributed.bucket_mb=0.05 'plugins.recording.events=[]' --run-dir " +
                       (tmp / "two"));
  ASSERT_EQ(o.code, 0) << o.text;
  for (const char* log : {"two/trainer.log", "two/rank-1.log"}) {
    const std::string text = read_file(tmp / log);
    EXPECT_NE(text.find("the all-reduce starts after the backward, not inside it: a plugin handles AfterBackward"),
              std::string::npos)
        << log << ":\n"
        << text;
    EXPECT_EQ(text.find("started inside the backward"), std::string::npos) << log << ":\n" << text;
  }
}

TEST(DataParallel, ARunResumesWithAnotherNumberOfRanksAtTheNextSample) {
  TempDir tmp;
  const std::string r = recipe(tmp) + " --log-level warn";
  const std::string one = trainer_cmd() + " --recipe " + r, two = trainer_cmd() + " launch --nproc 2 -- --recipe " + r;
  ASSERT_EQ(run_command(one + " --run-dir " + (tmp / "whole")).code, 0);
  // 2 ranks for 7 steps (in the middle of the first epoch), then 1 rank to the end.
  auto o = run_command(two + " training.max_steps=7 --run-dir " + (tmp / "a"));
  ASSERT_EQ(o.code, 0) << o.text;
  o = run_command(one + " --resume " + (tmp / "a") + " --run-dir " + (tmp / "a1"));
  ASSERT_EQ(o.code, 0) << o.text;
  // 1 rank for 13 steps (in the second epoch), then 2 ranks to the end.
  o = run_command(one + " training.max_steps=13 --run-dir " + (tmp / "b"));
  ASSERT_EQ(o.code, 0) << o.text;
  o = run_command(two + " --resume " + (tmp / "b") + " --run-dir " + (tmp / "b2"));
  ASSERT_EQ(o.code, 0) << o.text;
  const std::string end = "/checkpoints/step_00000020.pt";
  EXPECT_EQ(largest_difference(tmp / ("whole" + end), tmp / ("a1" + end)), 0.0);
  EXPECT_EQ(largest_difference(tmp / ("whole" + end), tmp / ("b2" + end)), 0.0);
  // The resumed 2-rank run trained the rest of epoch 2 exactly once across its ranks.
  const auto r0 = indices_by_epoch(tmp / "b2/events.jsonl"), r1 = indices_by_epoch(tmp / "b2/events-rank1.jsonl");
  EXPECT_EQ(r0.at(1).size() + r1.at(1).size(), 640u - 3 * 64);
}

/// `trainer launch --nproc 2` of a run too long to end by itself, into <tmp>/run, its output
/// in <tmp>/out.
std::unique_ptr<trainer::testing::Child> long_launch(const TempDir& tmp) {
  ::setenv("TRAINER_CONFIG_PATH", TRAINER_SOURCE_DIR "/configs", 1);
  return std::make_unique<trainer::testing::Child>(std::string(TRAINER_CLI) + " launch --nproc 2 -- --recipe " +
                                                   recipe(tmp) + " training.epochs=1000 --run-dir " + (tmp / "run") +
                                                   " > " + (tmp / "out") + " 2>&1");
}

TEST(DataParallel, EachRankResumesWithItsOwnRandomStream) {
  // Dropout on global batches of 63: rank 0 draws for 32 samples, rank 1 for 31, so their
  // streams part after the first step. Resumed after step 7, each rank must draw on from its
  // own: the uninterrupted run's losses and model, bit for bit.
  TempDir tmp;
  const std::string two = trainer_cmd() + " launch --nproc 2 -- --recipe " + recipe(tmp) +
                          " model.dropout=0.5 training.batch_size=63 dataset.limit=630 --log-level warn";
  auto o = run_command(two + " --run-dir " + (tmp / "whole"));
  ASSERT_EQ(o.code, 0) << o.text;
  o = run_command(two + " training.max_steps=7 --run-dir " + (tmp / "a"));
  ASSERT_EQ(o.code, 0) << o.text;
  o = run_command(two + " --resume " + (tmp / "a") + " --run-dir " + (tmp / "a2"));
  ASSERT_EQ(o.code, 0) << o.text;
  const auto whole = metric_by_step(tmp / "whole/metrics.jsonl", "train/loss");
  const auto resumed = metric_by_step(tmp / "a2/metrics.jsonl", "train/loss");
  ASSERT_EQ(whole.size(), 20u);
  ASSERT_EQ(resumed.size(), 13u);
  for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, whole.at(step)) << "step " << step;
  const std::string end = "/checkpoints/step_00000020.pt";
  EXPECT_EQ(largest_difference(tmp / ("whole" + end), tmp / ("a2" + end)), 0.0);
}

/// The small CNN (no dropout, no BatchNorm, held contiguous) on 630 images in global batches of
/// 63: ranks of 32 and 31 samples, 10 steps; training metrics every 5 steps, the gradient's norm
/// among them (clipped at 1). Micro-batches of 32: the one process computes the ranks' parts.
std::string cnn_recipe(const TempDir& tmp) {
  const std::string path = tmp / "cnn.toml";
  write_file(path, R"(defaults = ["model/cnn", "dataset/fashion_mnist", "optim/adamw"]
[run]
name = "cnn"
seed = 7
[model]
channels = [4, 8]
hidden = 16
dropout = 0.0
batch_norm = false
memory_format = "contiguous"
[training]
epochs = 1
batch_size = 63
micro_batch_size = 32
log_every = 5
grad_clip_norm = 1.0
[dataset]
limit = 630
eval_limit = 100
[eval]
every_epochs = 0
at_end = false
[runtime]
num_threads = 1
[metrics]
console = false
)");
  return path;
}

/// Every train/* metric of a run directory by (step, name), but train/samples_per_s (a time).
std::map<std::pair<long, std::string>, double> training_metrics(const std::string& dir) {
  std::map<std::pair<long, std::string>, double> out;
  for (const auto& l : read_lines(dir + "/metrics.jsonl")) {
    const std::string name = trainer::testing::json_str(l, "name");
    if (name.rfind("train/", 0) != 0 || name == "train/samples_per_s") continue;
    out[{static_cast<long>(*trainer::testing::json_num(l, "step")), name}] = *trainer::testing::json_num(l, "value");
  }
  return out;
}

TEST(DataParallel, EveryLoggedTrainingMetricIsTheOneProcessRunsAtEveryLogEvery) {
  // Ranks of 32 and 31 samples, a window of 5 steps. Rank 1 holds its model channels-last when
  // it is built (as its own memory-format probe might have chosen): every rank takes rank 0's
  // format, so the ranks train the one process's model and log its metrics. They differ only in
  // the order of the sums behind each value (the one process adds its two micro-batches' float32
  // losses on the device, the ranks add theirs in double): a few float32 roundings, ~1e-7
  // relative; 1e-6 leaves room for them. A rank that trained on weights in the wrong places
  // moved train/loss by ~1e-2 by step 5.
  TempDir tmp;
  const std::string r = cnn_recipe(tmp);
  auto one = run_command(trainer_cmd() + " --recipe " + r + " --run-dir " + (tmp / "one") + " --log-level warn");
  ASSERT_EQ(one.code, 0) << one.text;
  auto two = run_command(trainer_cmd() + " launch --nproc 2 -- --recipe " + r + " --plugin-dir " +
                         TRAINER_TEST_PLUGIN_DIR + " 'plugins.load=[\"channels_last\"]' --run-dir " + (tmp / "two"));
  ASSERT_EQ(two.code, 0) << two.text;
  const auto a = training_metrics(tmp / "one"), b = training_metrics(tmp / "two");
  // Steps 5 and 10 (the epoch's end): loss, accuracy, grad_norm, lr, epoch, micro_batch_size.
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), a.size());
  for (const auto& [key, v] : a) {
    ASSERT_EQ(b.count(key), 1u) << key.second << " at step " << key.first;
    EXPECT_NEAR(b.at(key), v, 1e-6 * std::fabs(v)) << key.second << " at step " << key.first;
  }
}

TEST(DataParallel, RankZerosWeightsReachARankHoldingItsModelInAnotherLayout) {
  // Rank 1 goes channels-last after the memory format is applied: rank 0's weights, broadcast
  // at the start, must land on the same values there. Its kernels then sum in another order, so
  // the losses are compared as those of another split (expect_same_losses: within 1e-4).
  TempDir tmp;
  const std::string r = cnn_recipe(tmp) + " training.log_every=1";
  auto one = run_command(trainer_cmd() + " --recipe " + r + " --run-dir " + (tmp / "one") + " --log-level warn");
  ASSERT_EQ(one.code, 0) << one.text;
  auto two = run_command(
      trainer_cmd() + " launch --nproc 2 -- --recipe " + r + " --plugin-dir " + TRAINER_TEST_PLUGIN_DIR +
      " 'plugins.load=[\"channels_last\"]' plugins.channels_last.event=\"ModelToDevice\" --run-dir " + (tmp / "two"));
  ASSERT_EQ(two.code, 0) << two.text;
  trainer::testing::expect_same_losses(tmp / "one", tmp / "two", 10);
  // model.memory_format = "auto": rank 0's probe decides for every rank.
  auto probe = run_command(trainer_cmd() + " launch --nproc 2 -- --recipe " + r +
                           " model.memory_format=\"auto\" training.max_steps=1 --run-dir " + (tmp / "auto"));
  ASSERT_EQ(probe.code, 0) << probe.text;
  std::smatch m;
  const std::string log0 = read_file(tmp / "auto/trainer.log"), log1 = read_file(tmp / "auto/rank-1.log");
  ASSERT_TRUE(std::regex_search(log0, m,
                                std::regex("memory format: ([a-z_]+) \\(model.memory_format = auto: "
                                           "forward\\+backward")))
      << log0;
  EXPECT_NE(log1.find("memory format: " + m[1].str() + " (model.memory_format = auto: rank 0's probe, for every rank)"),
            std::string::npos)
      << log1;
}

TEST(DataParallel, RanksWaitForRankZerosCheckpointLongerThanTheTimeout) {
  // Writing the checkpoint of step 3 takes rank 0 six seconds (the test plugin stall, in the
  // Checkpoint event), three times distributed.timeout_s: the other rank waits for it outside
  // the collectives, and nobody is blamed.
  TempDir tmp;
  auto o = run_command(trainer_cmd() + " launch --nproc 2 -- --recipe " + recipe(tmp) +
                       " training.max_steps=6 checkpoint.every_steps=3 distributed.timeout_s=2 --plugin-dir " +
                       TRAINER_TEST_PLUGIN_DIR +
                       " 'plugins.load=[\"recording\", \"stall\"]' plugins.stall.rank=0 plugins.stall.at_step=3"
                       " plugins.stall.seconds=6 plugins.stall.event=Checkpoint --run-dir " +
                       (tmp / "two"));
  ASSERT_EQ(o.code, 0) << o.text;
  EXPECT_NE(read_file(tmp / "two/status.json").find("\"status\":\"FINISHED\""), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(tmp / "two/checkpoints/step_00000003.pt"));
  EXPECT_TRUE(std::filesystem::exists(tmp / "two/checkpoints/step_00000006.pt"));
  for (const char* log : {"two/trainer.log", "two/rank-1.log"}) {
    EXPECT_EQ(read_file(tmp / log).find("failed"), std::string::npos) << read_file(tmp / log);
  }
}

TEST(DataParallel, CtrlCOnTheLauncherStopsEveryRankWithACheckpoint) {
  TempDir tmp;
  auto launcher_ptr = long_launch(tmp);
  ASSERT_TRUE(trainer::testing::wait_for_text(tmp / "run/metrics.jsonl", "train/loss")) << read_file(tmp / "out");
  trainer::testing::Child& launcher = *launcher_ptr;
  launcher.signal(SIGINT);
  EXPECT_EQ(WEXITSTATUS(launcher.wait()), 130) << read_file(tmp / "out");
  EXPECT_NE(read_file(tmp / "run/status.json").find("\"status\":\"KILLED\""), std::string::npos);
  EXPECT_FALSE(read_file(tmp / "run/checkpoints/latest").empty());
  EXPECT_NE(read_file(tmp / "run/rank-1.log").find("stopping: interrupted by a signal"), std::string::npos)
      << read_file(tmp / "run/rank-1.log");
}

/// The pid of rank `rank` among the children of `parent` (read from their environment).
pid_t rank_pid(pid_t parent, int rank) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(e.path() / "stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos || std::stol(stat.substr(close + 4)) != parent) continue;  // ") S <ppid>"
    std::string env = read_file(e.path() / "environ");
    for (char& c : env) c = c == '\0' ? '\n' : c;
    if (env.find("\nRANK=" + std::to_string(rank) + "\n") != std::string::npos) return std::stoi(name);
  }
  return -1;
}

TEST(DataParallel, ASignalToOneRankStopsEveryRankAsInterrupted) {
  TempDir tmp;
  auto launcher_ptr = long_launch(tmp);
  ASSERT_TRUE(trainer::testing::wait_for_text(tmp / "run/metrics.jsonl", "train/loss")) << read_file(tmp / "out");
  trainer::testing::Child& launcher = *launcher_ptr;
  const pid_t rank1 = rank_pid(launcher.pid(), 1);
  ASSERT_GT(rank1, 0);
  ::kill(rank1, SIGTERM);  // a scheduler stopping one process
  EXPECT_EQ(WEXITSTATUS(launcher.wait()), 130) << read_file(tmp / "out");
  const std::string status = read_file(tmp / "run/status.json");
  EXPECT_NE(status.find("\"status\":\"KILLED\""), std::string::npos) << status;
  EXPECT_NE(read_file(tmp / "run/trainer.log").find("interrupted by a signal on rank 1"), std::string::npos)
      << read_file(tmp / "run/trainer.log");
}

TEST(DataParallel, LaunchArgumentsAreCheckedAndAFailingRankStopsTheRun) {
  TempDir tmp;
  auto o = run_command(trainer_cmd() + " launch --nproc 0 -- --recipe x.toml");
  EXPECT_EQ(o.code, 2) << o.text;
  EXPECT_NE(o.text.find("--nproc '0': expected a number of processes from 1 to 1024"), std::string::npos) << o.text;
  o = run_command(trainer_cmd() + " launch --nproc 2");
  EXPECT_EQ(o.code, 2) << o.text;
  EXPECT_NE(o.text.find("the trainer's arguments follow '--'"), std::string::npos) << o.text;
  // Both ranks refuse a bad override: the launcher exits with their code.
  o = run_command(trainer_cmd() + " launch --nproc 2 -- --recipe " + recipe(tmp) + " training.nope=1");
  EXPECT_EQ(o.code, 2) << o.text;
  EXPECT_NE(o.text.find("training.nope"), std::string::npos) << o.text;
}

}  // namespace
