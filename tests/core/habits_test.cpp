// What users of other trainers do without thinking: resume a run in place (or have a requeued
// job resume itself), evaluate every N steps and at the end, have a diverging run stop instead
// of training on NaN (or on skipping nearly every step), take the threads the machine has free,
// and Ctrl-C answered in the long phases before the first step; a start that fails or is
// interrupted leaves no empty run directory of its own naming.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sched.h>

#include <filesystem>
#include <limits>
#include <regex>
#include <set>

#include "support/test_util.h"
#include "support/tiny_text.h"
#include "trainer/interrupt.h"
#include "trainer/run_records.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::json_num;
using testing::json_str;
using testing::read_file;
using testing::read_lines;

namespace fs = std::filesystem;

/// Makes the loss (`which` = "loss": the micro-batch's loss itself, so the gradients too) or only
/// the gradients ("gradient": the tensor backward() runs on) NaN in the optimizer steps `at`
/// (counted from 1 over the steps this plugin sees: a skipped step counts too).
class NanAt final : public Plugin {
 public:
  NanAt(std::string which, std::set<std::int64_t> at) : which_(std::move(which)), at_(std::move(at)) {}
  std::string name() const override { return "nan_at"; }
  std::vector<Event> events() const override { return {Event::BatchStart, Event::AfterForward, Event::BeforeBackward}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::BatchStart) ++batch_;
    if (!at_.count(batch_)) return;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (ctx.event == Event::AfterForward && which_ == "loss") ctx.loss->mul_(nan);
    if (ctx.event == Event::BeforeBackward && which_ == "gradient") *ctx.backward_loss = *ctx.backward_loss * nan;
  }

 private:
  std::string which_;
  std::set<std::int64_t> at_;
  std::int64_t batch_ = 0;
};

/// Raises the interrupt flag at `at`, as Ctrl-C arriving then would.
class InterruptAt final : public Plugin {
 public:
  explicit InterruptAt(Event at) : at_(at) {}
  std::string name() const override { return "interrupt_at"; }
  std::vector<Event> events() const override { return {at_}; }
  void on_event(EventContext&, Control&) override { request_interrupt(); }

 private:
  Event at_;
};

class Habits : public testing::TrainerTest {
 protected:
  /// kSmallRun in batches of 16: 4 steps an epoch, 8 in all; a checkpoint every step, 3 kept.
  TrainerOptions options(const std::vector<std::string>& overrides, const std::string& name,
                         std::vector<std::shared_ptr<Plugin>> extra = {}) {
    std::vector<std::string> all = {"training.batch_size=16", "checkpoint.every_steps=1", "checkpoint.keep_last=3"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    TrainerOptions o = options_for(testing::kSmallRun, all, name, extra);
    o.log_level = "info";  // the tests read trainer.log's info lines
    return o;
  }
  static RunResult fit(TrainerOptions o) { return Trainer(std::move(o)).fit(); }

  /// The steps of `name` in metrics.jsonl, in file order (a step logged twice appears twice).
  static std::vector<long> steps_of(const std::string& dir, const std::string& name) {
    std::vector<long> out;
    for (const auto& l : read_lines(dir + "/metrics.jsonl")) {
      if (json_str(l, "name") == name) out.push_back(static_cast<long>(*json_num(l, "step")));
    }
    return out;
  }
  static std::vector<std::string> checkpoints_in(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir + "/checkpoints")) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  /// The sum of each tensor of a checkpoint's model (never empty: the MLP has parameters).
  static std::vector<double> parameters(const std::string& checkpoint) {
    torch::serialize::InputArchive ar, m;
    ar.load_from(checkpoint);
    ar.read("model", m);
    std::vector<double> out;
    collect(m, out);
    EXPECT_FALSE(out.empty()) << checkpoint;
    return out;
  }
  static void collect(torch::serialize::InputArchive& archive, std::vector<double>& out) {
    for (const auto& key : archive.keys()) {
      at::Tensor t;
      torch::serialize::InputArchive sub;
      if (archive.try_read(key, t)) {
        out.push_back(t.sum().item<double>());
      } else if (archive.try_read(key, sub)) {
        collect(sub, out);
      }
    }
  }
};

// `--resume RUN_DIR` alone: the run goes on in its own directory (metrics, log, status appended
// or rewritten there, the resume marked in metrics.jsonl), prunes the checkpoints of both parts
// as one run, and ends where an uninterrupted run ends.
TEST_F(Habits, AResumeWithoutARunDirectoryGoesOnInTheRunsOwnDirectory) {
  fix_threads();
  const RunResult straight = fit(options({}, "straight"));
  ASSERT_EQ(straight.exit_code, kExitOk) << straight.message;

  ASSERT_EQ(fit(options({"training.max_steps=3"}, "run")).exit_code, kExitOk);
  TrainerOptions o = options({}, "ignored");
  o.run_dir.clear();
  o.resume = tmp_ / "run";
  const RunResult r = fit(std::move(o));
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.run_dir, tmp_ / "run");
  EXPECT_EQ(r.global_step, 8);
  // Each step logged once, in order, with the resume marked at step 3.
  EXPECT_EQ(steps_of(tmp_ / "run", "train/loss"), (std::vector<long>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(steps_of(tmp_ / "run", "resume/step"), (std::vector<long>{3}));
  EXPECT_EQ(decode_status(read_file(tmp_ / "run/status.json")).status, RunStatus::Finished);
  const std::string log = read_file(tmp_ / "run/trainer.log");
  EXPECT_NE(log.find("(resuming in place)"), std::string::npos) << log;
  // keep_last = 3 over both parts: steps 6, 7, 8.
  EXPECT_EQ(checkpoints_in(tmp_ / "run"),
            (std::vector<std::string>{"latest", "step_00000006.pt", "step_00000006.pt.sum", "step_00000007.pt",
                                      "step_00000007.pt.sum", "step_00000008.pt", "step_00000008.pt.sum"}));
  EXPECT_EQ(parameters(tmp_ / "run/checkpoints/step_00000008.pt"),
            parameters(tmp_ / "straight/checkpoints/step_00000008.pt"));
}

// Resuming in place from an earlier checkpoint (after a divergence, say): the later checkpoints
// are not this run's course; they move aside (kept, not lost) and `latest` names the one loaded
// until the next is written.
TEST_F(Habits, ResumingInPlaceFromAnEarlierCheckpointMovesTheLaterOnesAside) {
  ASSERT_EQ(fit(options({"training.max_steps=5"}, "run")).exit_code, kExitOk);
  TrainerOptions o = options({"training.max_steps=4"}, "run");
  o.resume = tmp_ / "run/checkpoints/step_00000003.pt";
  const RunResult r = fit(std::move(o));
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 4);
  const fs::path aside = tmp_ / "run/checkpoints/superseded_after_step_3";
  EXPECT_TRUE(fs::exists(aside / "step_00000004.pt"));
  EXPECT_TRUE(fs::exists(aside / "step_00000005.pt.sum"));
  EXPECT_EQ(read_file(tmp_ / "run/checkpoints/latest"), "step_00000004.pt\n");
  // Steps 4 and 5 of the first course, then 4 again: the report draws the resume at 3.
  EXPECT_EQ(steps_of(tmp_ / "run", "train/loss"), (std::vector<long>{1, 2, 3, 4, 5, 4}));
}

// A resume in place with nothing left to train does not write its checkpoint again.
TEST_F(Habits, AResumeInPlaceOfAFinishedRunRewritesNoCheckpoint) {
  ASSERT_EQ(fit(options({}, "run")).exit_code, kExitOk);
  const std::string last = tmp_ / "run/checkpoints/step_00000008.pt";
  const auto written = fs::last_write_time(last);
  TrainerOptions o = options({}, "run");
  o.resume = tmp_ / "run";
  const RunResult r = fit(std::move(o));
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 8);
  EXPECT_EQ(r.last_checkpoint, last);
  EXPECT_EQ(fs::last_write_time(last), written);
}

// checkpoint.autoresume: the same start twice (a requeued job) resumes the second time; the
// config changes of a resume are logged.
TEST_F(Habits, AutoresumeResumesARunDirectoryThatHoldsCheckpoints) {
  const RunResult first = fit(options({"checkpoint.autoresume=true", "training.max_steps=3"}, "job"));
  ASSERT_EQ(first.exit_code, kExitOk) << first.message;
  EXPECT_EQ(first.global_step, 3);
  EXPECT_TRUE(steps_of(tmp_ / "job", "resume/step").empty());
  const RunResult again = fit(options({"checkpoint.autoresume=true"}, "job"));
  ASSERT_EQ(again.exit_code, kExitOk) << again.message;
  EXPECT_EQ(again.global_step, 8);
  EXPECT_EQ(steps_of(tmp_ / "job", "resume/step"), (std::vector<long>{3}));
  const std::string log = read_file(tmp_ / "job/trainer.log");
  EXPECT_NE(log.find("checkpoint.autoresume: " + (tmp_ / "job") + " holds checkpoints"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed with config changes: training.max_steps 3 -> 0"), std::string::npos) << log;
  // Without a run directory named at every start there is nothing to find.
  TrainerOptions unnamed = options({"checkpoint.autoresume=true"}, "unused");
  unnamed.run_dir.clear();
  const RunResult refused = fit(std::move(unnamed));
  EXPECT_EQ(refused.exit_code, kExitUsage);
  EXPECT_NE(refused.message.find("checkpoint.autoresume = true needs the run directory named (--run-dir DIR"),
            std::string::npos)
      << refused.message;
}

// A run stopped between log_every steps still logs its final training metrics (the steps since
// the last log).
TEST_F(Habits, ARunStoppedBetweenLogsLogsItsFinalMetrics) {
  ASSERT_EQ(fit(options({"training.log_every=5", "training.max_steps=3"}, "run")).exit_code, kExitOk);
  EXPECT_EQ(steps_of(tmp_ / "run", "train/loss"), (std::vector<long>{3}));
  EXPECT_EQ(steps_of(tmp_ / "run", "train/accuracy"), (std::vector<long>{3}));
}

// eval.every_steps beside every_epochs: an epoch's end that evaluates anyway is not evaluated twice.
TEST_F(Habits, EvalEveryStepsEvaluatesBetweenTheEpochsOnce) {
  ASSERT_EQ(fit(options({"eval.every_steps=3"}, "run")).exit_code, kExitOk);
  EXPECT_EQ(steps_of(tmp_ / "run", "eval/loss"), (std::vector<long>{3, 4, 6, 8}));
  ASSERT_EQ(fit(options({"eval.every_steps=2"}, "both")).exit_code, kExitOk);
  EXPECT_EQ(steps_of(tmp_ / "both", "eval/loss"), (std::vector<long>{2, 4, 6, 8}));
  ASSERT_EQ(fit(options({"eval.every_steps=2", "eval.every_epochs=0", "eval.at_end=false"}, "steps")).exit_code,
            kExitOk);
  EXPECT_EQ(steps_of(tmp_ / "steps", "eval/loss"), (std::vector<long>{2, 4, 6, 8}));
}

// checkpoint.monitor: the save_top_k best scored checkpoints and the newest keep_last are kept,
// each scored one with its score beside it, and `best` names the best.
TEST_F(Habits, CheckpointsAreKeptByTheMonitoredMetric) {
  const RunResult r =
      fit(options({"training.epochs=4", "eval.every_steps=2", "eval.every_epochs=0", "eval.at_end=false",
                   "checkpoint.every_steps=2", "checkpoint.every_epochs=0", "checkpoint.keep_last=1",
                   "checkpoint.monitor=\"eval/loss\"", "checkpoint.save_top_k=2"},
                  "run"));
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(r.global_step, 16);
  // The two lowest eval/loss of the run's own evaluations (steps 2, 4, ..., 16), and step 16.
  std::vector<std::pair<double, long>> losses;
  for (const auto& [step, loss] : testing::metric_by_step(tmp_ / "run/metrics.jsonl", "eval/loss")) {
    losses.emplace_back(loss, step);
  }
  ASSERT_EQ(losses.size(), 8u);
  std::stable_sort(losses.begin(), losses.end());
  const auto name = [](long step) {
    char n[32];
    std::snprintf(n, sizeof n, "step_%08ld.pt", step);
    return std::string(n);
  };
  std::set<std::string> expected = {"best", "latest", name(16), name(16) + ".sum", name(16) + ".score"};
  for (int i = 0; i < 2; ++i) {
    for (const char* side : {"", ".sum", ".score"}) expected.insert(name(losses[i].second) + side);
  }
  const auto files = checkpoints_in(tmp_ / "run");
  EXPECT_EQ(std::set<std::string>(files.begin(), files.end()), expected);
  EXPECT_EQ(read_file(tmp_ / "run/checkpoints/best"), name(losses[0].second) + "\n");
  const std::string score = read_file(tmp_ / ("run/checkpoints/" + name(losses[0].second) + ".score"));
  EXPECT_EQ(score.rfind("eval/loss ", 0), 0u) << score;
  EXPECT_DOUBLE_EQ(std::stod(score.substr(10)), losses[0].first);
}

// A monitor the evaluation does not produce is a usage error naming what it has; early_stopping
// watches checkpoint.monitor when it names no metric of its own.
TEST_F(Habits, AMonitorTheEvaluationLacksIsRefusedAndEarlyStoppingFollowsIt) {
  const RunResult r = fit(options({"checkpoint.monitor=\"eval/nope\""}, "run"));
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("checkpoint.monitor = 'eval/nope' is not among the evaluation's metrics (eval/accuracy"),
            std::string::npos)
      << r.message;
  const RunResult es =
      fit(options({"checkpoint.monitor=\"eval/nope\"", "plugins.load=[\"early_stopping\"]"}, "early_stopping"));
  EXPECT_EQ(es.exit_code, kExitUsage);
  EXPECT_NE(es.message.find("checkpoint.monitor = 'eval/nope' (which early_stopping watches) is not among the "
                            "evaluation's metrics"),
            std::string::npos)
      << es.message;
}

// training.on_nonfinite = "stop" (the default): a NaN loss, or finite loss with NaN gradients
// (clipped or not), ends the run FAILED, diverged, exit 3, before that optimizer step; the last
// good checkpoint stays latest and no checkpoint of the diverged state is written.
TEST_F(Habits, ANonFiniteLossOrGradientStopsTheRunAsDiverged) {
  struct Case {
    std::string which;
    std::vector<std::string> overrides;
    std::string said;
  };
  for (const Case& c : {Case{"loss", {}, "the loss is NaN"}, Case{"gradient", {}, "the gradient norm is NaN"},
                        Case{"gradient", {"training.grad_clip_norm=1"}, "the gradient norm is NaN"}}) {
    const std::string name = c.which + std::to_string(c.overrides.size());
    const RunResult r = fit(options(c.overrides, name, {std::make_shared<NanAt>(c.which, std::set<std::int64_t>{6})}));
    EXPECT_EQ(r.exit_code, kExitTrainingFailed) << name;
    EXPECT_EQ(r.failure, FailureKind::Diverged) << name;
    EXPECT_EQ(r.global_step, 5) << name;
    EXPECT_NE(r.message.find("training diverged at step 6 (epoch 2, batch 2): " + c.said), std::string::npos)
        << r.message;
    const RunStatusRecord s = decode_status(read_file(tmp_ / (name + "/status.json")));
    EXPECT_EQ(s.failure, FailureKind::Diverged);
    EXPECT_EQ(s.exit_code, kExitTrainingFailed);
    EXPECT_EQ(read_file(tmp_ / (name + "/checkpoints/latest")), "step_00000005.pt\n") << name;
    EXPECT_FALSE(fs::exists(tmp_ / (name + "/checkpoints/step_00000006.pt"))) << name;
    EXPECT_TRUE(std::isfinite(parameters(tmp_ / (name + "/checkpoints/step_00000005.pt")).at(0))) << name;
  }
}

// "skip_step" skips the optimizer steps of such batches and goes on, counting them (status.json,
// metrics, an epoch's summary line); "ignore" checks nothing.
TEST_F(Habits, SkipStepSkipsTheNonFiniteStepsAndIgnoreTrainsOnThem) {
  const RunResult skipped = fit(options({"training.on_nonfinite=\"skip_step\""}, "skip",
                                        {std::make_shared<NanAt>("gradient", std::set<std::int64_t>{2, 6})}));
  ASSERT_EQ(skipped.exit_code, kExitOk) << skipped.message;
  EXPECT_EQ(skipped.global_step, 6);  // 8 batches, 2 skipped
  for (double v : parameters(tmp_ / "skip/checkpoints/step_00000006.pt")) EXPECT_TRUE(std::isfinite(v));
  const std::string log = read_file(tmp_ / "skip/trainer.log");
  EXPECT_NE(log.find("step 5 (epoch 2, batch 2): the gradient norm is NaN; optimizer step skipped "
                     "(training.on_nonfinite = \"skip_step\"; 2 skipped so far, 1 in a row)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("epoch 2: 1 optimizer step skipped for a NaN or infinite loss or gradient "
                     "(training.on_nonfinite = \"skip_step\"; 2 in the run, 0 in a row now)"),
            std::string::npos)
      << log;
  const RunStatusRecord s = decode_status(read_file(tmp_ / "skip/status.json"));
  EXPECT_EQ(s.status, RunStatus::Finished);
  EXPECT_EQ(s.skipped_steps, 2);
  EXPECT_EQ(s.skipped_in_a_row, 0);
  // Logged with every window from the first skip on (batch 2, before step 2).
  EXPECT_EQ(testing::metric_by_step(tmp_ / "skip/metrics.jsonl", "train/skipped_steps"),
            (std::map<long, double>{{2, 1}, {3, 1}, {4, 1}, {5, 2}, {6, 2}}));
  EXPECT_EQ(testing::metric_by_step(tmp_ / "skip/metrics.jsonl", "train/skipped_in_a_row").at(6), 0);
  const RunResult ignored = fit(options({"training.on_nonfinite=\"ignore\""}, "ignore",
                                        {std::make_shared<NanAt>("gradient", std::set<std::int64_t>{2})}));
  ASSERT_EQ(ignored.exit_code, kExitOk) << ignored.message;
  EXPECT_EQ(ignored.global_step, 8);
  EXPECT_TRUE(std::isnan(parameters(tmp_ / "ignore/checkpoints/step_00000008.pt").at(0)));
}

// A run whose steps keep being skipped has diverged: with a learning rate of 1e30 the first step
// leaves weights that give a non-finite loss on every batch after it. Past
// training.max_skipped_steps (10) in a row the run fails as diverged (exit 3), with no checkpoint
// of those weights written at its end, the counts in status.json, metrics.jsonl and the report.
TEST_F(Habits, ARunThatKeepsSkippingStepsFailsAsDiverged) {
  const std::vector<std::string> diverging = {"training.on_nonfinite=\"skip_step\"", "optim.lr=1e30",
                                              "training.batch_size=2", "checkpoint.every_steps=0"};
  const RunResult r = fit(options(diverging, "dead"));
  EXPECT_EQ(r.exit_code, kExitTrainingFailed) << r.message;
  EXPECT_EQ(r.failure, FailureKind::Diverged);
  EXPECT_EQ(r.global_step, 1);
  EXPECT_NE(r.message.find("training diverged: 11 optimizer steps in a row skipped for a NaN or infinite loss or "
                           "gradient (training.on_nonfinite = \"skip_step\"; training.max_skipped_steps = 10; 11 "
                           "skipped in the run), the last at step 2 (epoch 1, batch 12)"),
            std::string::npos)
      << r.message;
  const RunStatusRecord s = decode_status(read_file(tmp_ / "dead/status.json"));
  EXPECT_EQ(s.failure, FailureKind::Diverged);
  EXPECT_EQ(s.skipped_steps, 11);
  EXPECT_EQ(s.skipped_in_a_row, 11);
  EXPECT_EQ(testing::metric_by_step(tmp_ / "dead/metrics.jsonl", "train/skipped_in_a_row").rbegin()->second, 11);
  EXPECT_FALSE(fs::exists(tmp_ / "dead/checkpoints/latest"));  // none before, none of the diverged weights
  const auto page = testing::run_command(std::string(TRAINER_CLI) + " report " + (tmp_ / "dead"));
  ASSERT_EQ(page.code, 0) << page.text;
  EXPECT_NE(read_file(tmp_ / "dead/report.html")
                .find("<dt>Skipped steps</dt><dd>11 for a NaN or infinite loss or gradient, 11 in a row at the end"),
            std::string::npos);
  // With no limit (0) it trains to the end, skipping: each of the first 10 skips warned, then each
  // power of two, and every epoch's end says how many it skipped.
  const RunResult unlimited = fit(options(
      {"training.on_nonfinite=\"skip_step\"", "optim.lr=1e30", "training.batch_size=2", "training.max_skipped_steps=0"},
      "unlimited"));
  ASSERT_EQ(unlimited.exit_code, kExitOk) << unlimited.message;
  EXPECT_EQ(unlimited.global_step, 1);
  const std::string log = read_file(tmp_ / "unlimited/trainer.log");
  std::size_t warned = 0;
  for (std::size_t at = log.find("optimizer step skipped"); at != std::string::npos;
       at = log.find("optimizer step skipped", at + 1)) {
    ++warned;
  }
  EXPECT_EQ(warned, 12u) << log;  // skips 1-10, 16 and 32 of 63
  EXPECT_NE(log.find("32 skipped so far, 32 in a row"), std::string::npos) << log;
  EXPECT_NE(log.find("epoch 2: 32 optimizer steps skipped for a NaN or infinite loss or gradient "
                     "(training.on_nonfinite = \"skip_step\"; 63 in the run, 63 in a row now)"),
            std::string::npos)
      << log;
  EXPECT_EQ(decode_status(read_file(tmp_ / "unlimited/status.json")).skipped_steps, 63);
}

// runtime.num_threads = 0 (the default) takes the cores this process may run on less the load
// other work puts on them (tests/core/cpu_load_test.cpp has the choice under given loads), and
// logs it with its reasons; a number given is kept.
TEST_F(Habits, TheDefaultThreadCountIsChosenFromTheCoresAndTheirLoadAndLogged) {
  ASSERT_EQ(fit(options({"training.max_steps=1"}, "default")).exit_code, kExitOk);
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  const int cores = CPU_COUNT(&set);
  const std::string log = read_file(tmp_ / "default/trainer.log");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m,
                                std::regex("runtime\\.num_threads = 0: ([0-9]+) threads? \\(([0-9]+) cores?, "
                                           "[0-9]+\\.[0-9] busy with other work\\)\n")))
      << log;
  EXPECT_EQ(std::stoi(m[2]), cores);
  EXPECT_GE(std::stoi(m[1]), 1);
  EXPECT_LE(std::stoi(m[1]), cores);
  EXPECT_NE(log.find("threads: " + m[1].str() + ", seed: "), std::string::npos) << log;
  ASSERT_EQ(fit(options({"training.max_steps=1", "runtime.num_threads=3"}, "three")).exit_code, kExitOk);
  const std::string three = read_file(tmp_ / "three/trainer.log");
  EXPECT_NE(three.find("threads: 3, seed: "), std::string::npos) << three;
  EXPECT_EQ(three.find("runtime.num_threads = 0"), std::string::npos) << three;
}

// Every run ends with its evaluation (eval.at_end, the default), once: one stopped by
// training.max_steps in the middle of an epoch too, and one with eval.every_epochs = 0; with
// eval.at_end = false as well the run never evaluates.
TEST_F(Habits, ARunEndsWithItsEvaluationByDefault) {
  const RunResult r = fit(options({"training.max_steps=3"}, "short"));
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(steps_of(tmp_ / "short", "eval/accuracy"), (std::vector<long>{3}));
  EXPECT_EQ(r.final_metrics.count("eval/accuracy"), 1u);
  EXPECT_EQ(steps_of(tmp_ / "short", "train/loss"), (std::vector<long>{1, 2, 3}));
  ASSERT_EQ(fit(options({}, "full")).exit_code, kExitOk);
  EXPECT_EQ(steps_of(tmp_ / "full", "eval/loss"), (std::vector<long>{4, 8}));  // the last epoch's, not twice
  ASSERT_EQ(fit(options({"eval.every_epochs=0"}, "end_only")).exit_code, kExitOk);
  EXPECT_EQ(steps_of(tmp_ / "end_only", "eval/loss"), (std::vector<long>{8}));
  ASSERT_EQ(fit(options({"eval.every_epochs=0", "eval.at_end=false"}, "never")).exit_code, kExitOk);
  EXPECT_TRUE(steps_of(tmp_ / "never", "eval/loss").empty());
}

// Ctrl-C while a text data set is tokenized ends the run there (KILLED, exit code 130), not
// after the scan: no checkpoint, and a run directory the run named itself, holding only what
// the core wrote, goes; one named with run_dir stays, its status.json saying KILLED.
TEST_F(Habits, CtrlCWhileADataSetIsTokenizedEndsTheRunThere) {
  const std::string recipe = testing::tiny_text_recipe(tmp_ / "text");
  const auto interrupt = std::make_shared<InterruptAt>(Event::SelectDevice);  // before the data set
  TrainerOptions o = options_for(recipe, {"run.dir=\"" + (tmp_ / "runs") + "\""}, "unused", {interrupt});
  o.run_dir.clear();
  const RunResult r = Trainer(std::move(o)).fit();
  clear_interrupt();
  EXPECT_EQ(r.exit_code, kExitInterrupted) << r.message;
  EXPECT_EQ(r.status, RunStatus::Killed);
  EXPECT_NE(r.message.find("interrupted by a signal while tokenizing the text dataset"), std::string::npos)
      << r.message;
  EXPECT_TRUE(r.run_dir.empty()) << r.run_dir;
  EXPECT_TRUE(fs::is_empty(tmp_ / "runs"));

  const RunResult named = Trainer(options_for(recipe, {}, "named", {interrupt})).fit();
  clear_interrupt();
  EXPECT_EQ(named.exit_code, kExitInterrupted) << named.message;
  EXPECT_EQ(named.run_dir, tmp_ / "named");
  EXPECT_EQ(decode_status(read_file(tmp_ / "named/status.json")).status, RunStatus::Killed);
  EXPECT_TRUE(named.last_checkpoint.empty()) << named.last_checkpoint;
}

// Ctrl-C before the first step (here while the model is built) stops the loop before it: no
// checkpoint of untrained weights, though checkpoint.at_end is on.
TEST_F(Habits, CtrlCBeforeTheFirstStepWritesNoCheckpoint) {
  const RunResult r = fit(options({}, "run", {std::make_shared<InterruptAt>(Event::ModelCreated)}));
  clear_interrupt();
  EXPECT_EQ(r.exit_code, kExitInterrupted) << r.message;
  EXPECT_EQ(r.global_step, 0);
  EXPECT_TRUE(r.last_checkpoint.empty()) << r.last_checkpoint;
  EXPECT_EQ(decode_status(read_file(tmp_ / "run/status.json")).status, RunStatus::Killed);
}

// A start that fails before training, in a run directory it named itself, leaves none behind;
// one named with run_dir stays, its status.json saying why.
TEST_F(Habits, AStartThatFailsBeforeTrainingLeavesNoRunDirectoryOfItsOwnNaming) {
  const std::string recipe = "[run]\nname = \"t\"\ndir = \"" + (tmp_ / "runs") +
                             "\"\n[model]\nname = \"mlp\"\n[dataset]\nname = \"fashion_mnist\"\nroot = \"" +
                             (tmp_ / "nowhere") + "\"\n";
  TrainerOptions o = options_for(recipe, {}, "unused");
  o.run_dir.clear();
  const RunResult r = Trainer(std::move(o)).fit();
  EXPECT_EQ(r.exit_code, kExitUsage) << r.message;
  EXPECT_NE(r.message.find("Fashion-MNIST not found"), std::string::npos) << r.message;
  EXPECT_TRUE(r.run_dir.empty()) << r.run_dir;
  EXPECT_TRUE(fs::is_empty(tmp_ / "runs"));
  const RunResult named = Trainer(options_for(recipe, {}, "named")).fit();
  EXPECT_EQ(named.exit_code, kExitUsage) << named.message;
  EXPECT_EQ(named.run_dir, tmp_ / "named");
  EXPECT_EQ(decode_status(read_file(tmp_ / "named/status.json")).failure, FailureKind::Usage);
}

}  // namespace
}  // namespace trainer
