// What plugin authors rely on, end to end: plugin state in checkpoints and the Resume event
// (oom_backoff, early_stopping), why a run stopped, the gradient before clipping, per-batch
// evaluation events with plugin metrics, metrics of one step on one line, observer failures
// summarised.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <regex>

#include "support/test_util.h"
#include "trainer/memory.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::json_num;
using testing::json_str;
using testing::kSmallRun;
using testing::read_file;
using testing::read_lines;

const c10::Device kAuthorsCpu(c10::kCPU);

/// Keeps micro-batches above 16 from fitting (the next allocation after BeforeForward fails)
/// and records the micro-batch of every forward and each out-of-memory error.
class Tight final : public Plugin {
 public:
  std::string name() const override { return "tight"; }
  std::vector<Event> events() const override { return {Event::BeforeForward, Event::OutOfMemory}; }
  int default_priority() const override { return -10; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::OutOfMemory) {
      set_memory_limit(kAuthorsCpu, 0);
      ++ooms;
      return;
    }
    micro.push_back(ctx.state.micro_batch_size);
    if (ctx.state.micro_batch_size > 16 && ctx.state.micro_batch_index == 0) {
      set_memory_limit(kAuthorsCpu, memory_stats(kAuthorsCpu).allocated + 1024);
    }
  }
  std::vector<std::int64_t> micro;
  int ooms = 0;
};

class PluginAuthors : public testing::TrainerTest {
 protected:
  void TearDown() override { set_memory_limit(kAuthorsCpu, 0); }
  RunResult run(const std::vector<std::string>& overrides, const std::string& name,
                const std::vector<std::shared_ptr<Plugin>>& extra = {}, const std::string& resume = "",
                const std::string& recipe = kSmallRun) {
    TrainerOptions o = options_for(recipe, overrides, name, extra);
    o.resume = resume;
    o.log_level = "info";
    return Trainer(std::move(o)).fit();
  }
  /// The Resume line of a run's events.jsonl ("" when none).
  std::string resume_event(const std::string& run) {
    for (const auto& l : read_lines(tmp_ / (run + "/events.jsonl"))) {
      if (json_str(l, "event") == "Resume") return l;
    }
    return {};
  }
};

TEST_F(PluginAuthors, OomBackoffResumesWithWhatItLearnt) {
  // Micro-batches above 16 never fit. oom_backoff backs off 64 -> 32 -> 16 (ceiling 32), grows
  // after 3 clean steps to 24 (halfway to the ceiling), fails there (ceiling 24, patience
  // doubled to 6), and has 3 clean steps at 16 when max_steps stops the run.
  const std::vector<std::string> common = {"dataset.size=512",
                                           "training.batch_size=64",
                                           "+training.micro_batch_size=64",
                                           "model.hidden=[256]",
                                           "+plugins.load=[\"oom_backoff\", \"recording\"]",
                                           "+plugins.oom_backoff.grow_after=3"};
  auto first = std::make_shared<Tight>();
  auto o1 = common;
  o1.push_back("+training.max_steps=6");
  const RunResult a = run(o1, "a", {first});
  ASSERT_EQ(a.exit_code, kExitOk) << a.message;
  EXPECT_EQ(a.stopped_by, "training.max_steps");
  EXPECT_EQ(first->ooms, 3);
  EXPECT_EQ(first->micro.back(), 16);

  // Resumed: micro-batch 16 from the first batch, the ceiling 24 and the patience 6 with 3
  // clean steps already counted: after 3 batches (4 micro-batches each) it tries 20, halfway
  // to the ceiling. A fresh oom_backoff would start at 64 and run out of memory twice first.
  auto second = std::make_shared<Tight>();
  const RunResult b = run(common, "b", {second}, tmp_ / "a");
  ASSERT_EQ(b.exit_code, kExitOk) << b.message;
  ASSERT_GT(second->micro.size(), 12u);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(second->micro[i], 16) << i;
  EXPECT_EQ(second->micro[12], 20);
  EXPECT_EQ(second->ooms, 1);  // only the grow it tried on purpose
  const std::string resumed = resume_event("b");
  EXPECT_NE(resumed.find("\"restored\":[\"oom_backoff\"]"), std::string::npos) << resumed;
  EXPECT_NE(read_file(tmp_ / "b/trainer.log")
                .find("oom_backoff: restored micro-batch 16 (ceiling 24, 3 clean steps of 6 before growing)"),
            std::string::npos);

  // The same 10 steps without the state: it runs out of memory where the resumed run knew better.
  auto third = std::make_shared<Tight>();
  auto o3 = common;
  o3.push_back("+training.max_steps=10");
  const RunResult c = run(o3, "c", {third});
  ASSERT_EQ(c.exit_code, kExitOk) << c.message;
  EXPECT_GE(third->ooms, 3);
}

constexpr const char* kStopOnPlateau[] = {"training.epochs=20", "+plugins.load=[\"early_stopping\", \"recording\"]",
                                          "+plugins.early_stopping.monitor=eval/loss",
                                          "+plugins.early_stopping.min_delta=100.0"};

std::vector<std::string> plateau(std::int64_t patience, std::vector<std::string> more = {}) {
  std::vector<std::string> o(std::begin(kStopOnPlateau), std::end(kStopOnPlateau));
  o.push_back("+plugins.early_stopping.patience=" + std::to_string(patience));
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

TEST_F(PluginAuthors, EarlyStoppingStopsAndStatusJsonSaysWhoAndWhy) {
  // min_delta 100: only the first evaluation is ever an improvement.
  const RunResult r = run(plateau(2), "run");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.status, RunStatus::Finished);
  EXPECT_EQ(r.epochs_completed, 3);  // best at epoch 1, then 2 evaluations without improvement
  EXPECT_EQ(r.stopped_by, "early_stopping");
  EXPECT_NE(r.stop_reason.find("no improvement of eval/loss (min) for 2 evaluation(s); best"), std::string::npos)
      << r.stop_reason;
  const std::string status = read_file(tmp_ / "run/status.json");
  EXPECT_EQ(json_str(status, "status"), "FINISHED");
  EXPECT_EQ(json_str(status, "stopped_by"), "early_stopping");
  EXPECT_EQ(json_str(status, "reason"), r.stop_reason);
  const std::string log = read_file(tmp_ / "run/trainer.log");
  EXPECT_NE(log.find("status FINISHED (stopped by early_stopping: no improvement of eval/loss"), std::string::npos)
      << log;
}

TEST_F(PluginAuthors, EarlyStoppingStateSurvivesAResume) {
  // Stopped by max_steps after 2 epochs: 1 evaluation without improvement so far.
  const RunResult a = run(plateau(3, {"+training.max_steps=4"}), "a");
  ASSERT_EQ(a.exit_code, kExitOk) << a.message;
  EXPECT_EQ(a.stopped_by, "training.max_steps");
  // Resumed, it counts on from 1: stops after epoch 4 (a fresh count would go to epoch 5).
  // checkpoint.every_steps falls on each epoch's last step: the checkpoint is still written
  // after the epoch's evaluation, with the state it left.
  const RunResult b = run(plateau(3, {"+checkpoint.every_steps=2"}), "b", {}, tmp_ / "a");
  ASSERT_EQ(b.exit_code, kExitOk) << b.message;
  EXPECT_EQ(b.stopped_by, "early_stopping");
  EXPECT_EQ(b.epochs_completed, 4);
  EXPECT_NE(b.stop_reason.find("for 3 evaluation(s); best"), std::string::npos) << b.stop_reason;
  EXPECT_NE(b.stop_reason.find("at step 2"), std::string::npos) << b.stop_reason;  // the best is the first run's
  EXPECT_NE(resume_event("b").find("\"restored\":[\"early_stopping\"]"), std::string::npos);
  EXPECT_NE(read_file(tmp_ / "b/trainer.log").find("early_stopping: restored best eval/loss"), std::string::npos);

  // Resuming the early-stopped run does not train on.
  const RunResult c = run(plateau(3, {"+checkpoint.every_steps=2"}), "c", {}, tmp_ / "b");
  ASSERT_EQ(c.exit_code, kExitOk) << c.message;
  EXPECT_EQ(c.global_step, b.global_step);
  EXPECT_EQ(c.stopped_by, "early_stopping");
  EXPECT_NE(c.stop_reason.find("already stopped before the resume"), std::string::npos) << c.stop_reason;
}

TEST_F(PluginAuthors, EarlyStoppingKeepsTheBestCheckpoint) {
  const RunResult r = run(plateau(1, {"+plugins.early_stopping.save_best=true", "checkpoint.keep_last=1"}), "run");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.epochs_completed, 2);
  const std::string best = tmp_ / "run/checkpoints/best.pt";
  ASSERT_TRUE(std::filesystem::exists(best));
  EXPECT_TRUE(std::filesystem::exists(best + ".sum"));
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "run/checkpoints/step_00000002.pt"));  // pruned; best.pt stays
  // It is a complete checkpoint of step 2: resuming from it starts there.
  const RunResult again = run(plateau(1, {"+training.max_steps=2"}), "again", {}, best);
  ASSERT_EQ(again.exit_code, kExitOk) << again.message;
  EXPECT_EQ(again.global_step, 2);
}

TEST_F(PluginAuthors, EarlyStoppingWithAMetricThatDoesNotExistIsAUsageError) {
  const RunResult r = run(plateau(1, {"plugins.early_stopping.monitor=eval/f1"}), "run");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("plugins.early_stopping.monitor = 'eval/f1' is not among the evaluation's metrics "
                           "(eval/accuracy, eval/loss, eval/macro_f1, eval/top5_accuracy)"),
            std::string::npos)
      << r.message;
}

/// Sees the gradient at GradientsAccumulated (before clipping) and at BeforeOptimizerStep.
class GradProbe final : public Plugin {
 public:
  std::string name() const override { return "grad_probe"; }
  std::vector<Event> events() const override { return {Event::GradientsAccumulated, Event::BeforeOptimizerStep}; }
  void on_event(EventContext& ctx, Control&) override {
    double sq = 0;
    for (const auto& p : ctx.model->parameters()) {
      if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
    }
    if (ctx.event == Event::GradientsAccumulated) {
      unclipped.push_back(std::sqrt(sq));
    } else {
      clipped.push_back(std::sqrt(sq));
      reported.push_back(ctx.state.grad_norm);
    }
  }
  std::vector<double> unclipped, clipped, reported;
};

TEST_F(PluginAuthors, PluginsSeeTheGradientBeforeClippingAndTheCoreLogsItsNorm) {
  auto probe = std::make_shared<GradProbe>();
  const RunResult r = run({"+training.grad_clip_norm=0.001", "+training.micro_batch_size=8"}, "run", {probe});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(probe->unclipped.size(), 4u);
  ASSERT_EQ(probe->clipped.size(), 4u);
  const auto logged = testing::metric_by_step(tmp_ / "run/metrics.jsonl", "train/grad_norm");
  ASSERT_EQ(logged.size(), 4u);  // log_every = 1: one per step
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_GT(probe->unclipped[i], 0.01);         // the whole accumulated gradient
    EXPECT_NEAR(probe->clipped[i], 0.001, 1e-5);  // clipped to training.grad_clip_norm
    EXPECT_NEAR(probe->reported[i], probe->unclipped[i], 1e-4 * probe->unclipped[i]);
    EXPECT_NEAR(logged.at(static_cast<long>(i + 1)), probe->unclipped[i], 1e-4 * probe->unclipped[i]);
  }
}

/// A plugin metric from the evaluation's batches: accuracy counted from outputs and targets,
/// restarted at each EvalStart (an out-of-memory retry restarts the evaluation).
class EvalAccuracy final : public Plugin {
 public:
  std::string name() const override { return "eval_accuracy"; }
  std::vector<Event> events() const override {
    return {Event::EvalStart, Event::EvalBatchStart, Event::EvalBatchEnd, Event::EvalMetrics, Event::OutOfMemory};
  }
  void on_event(EventContext& ctx, Control&) override {
    switch (ctx.event) {
      case Event::EvalStart:
        correct_ = seen_ = 0;
        ++starts;
        break;
      case Event::EvalBatchStart:
        // The second batch of the first evaluation runs out of memory once.
        if (squeeze && ctx.indices->index({0}).item<std::int64_t>() == 8) {
          squeeze = false;
          set_memory_limit(kAuthorsCpu, memory_stats(kAuthorsCpu).allocated + 1024);
        }
        break;
      case Event::EvalBatchEnd:
        correct_ += ctx.outputs->argmax(1).eq(ctx.batch->targets).sum().item<std::int64_t>();
        seen_ += ctx.batch->size();
        batch_sizes.push_back(ctx.batch->size());
        EXPECT_TRUE(ctx.loss && ctx.loss->defined());
        break;
      case Event::EvalMetrics:
        (*ctx.eval_metrics)["eval/plugin_accuracy"] = double(correct_) / double(seen_);
        samples.push_back(seen_);
        break;
      case Event::OutOfMemory:
        set_memory_limit(kAuthorsCpu, 0);
        break;
      default:
        break;
    }
  }
  bool squeeze = true;
  int starts = 0;
  std::vector<std::int64_t> batch_sizes;
  std::vector<std::int64_t> samples;

 private:
  std::int64_t correct_ = 0, seen_ = 0;
};

TEST_F(PluginAuthors, PluginsComputeEvalMetricsFromTheBatchesAndTheyAreLoggedWithTheCores) {
  auto acc = std::make_shared<EvalAccuracy>();
  const RunResult r = run({"+eval.batch_size=8", "+plugins.load=[\"oom_backoff\"]", "training.epochs=3"}, "run", {acc});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(acc->starts, 4);  // three evaluations, the first restarted once after its OOM
  EXPECT_EQ(acc->samples, (std::vector<std::int64_t>{32, 32, 32}));  // each sample counted once
  const std::string metrics = tmp_ / "run/metrics.jsonl";
  const auto core = testing::metric_by_step(metrics, "eval/accuracy");
  const auto mine = testing::metric_by_step(metrics, "eval/plugin_accuracy");
  ASSERT_EQ(core.size(), 3u);
  EXPECT_EQ(mine, core);
  EXPECT_EQ(r.final_metrics.at("eval/plugin_accuracy"), r.final_metrics.at("eval/accuracy"));
  // The evaluation batch the retry settled on (4) is in the checkpoints: a resumed run
  // evaluates at 4 from the start.
  auto resumed = std::make_shared<EvalAccuracy>();
  resumed->squeeze = false;
  const RunResult b =
      run({"+eval.batch_size=8", "+plugins.load=[\"oom_backoff\"]", "training.epochs=4"}, "b", {resumed}, tmp_ / "run");
  ASSERT_EQ(b.exit_code, kExitOk) << b.message;
  EXPECT_NE(read_file(tmp_ / "b/trainer.log").find("evaluation batch 4 (eval.batch_size 8)"), std::string::npos);
  EXPECT_EQ(resumed->batch_sizes, (std::vector<std::int64_t>(8, 4)));  // 32 samples in batches of 4
}

/// Logs its own metric at every optimizer step; throws at every BatchEnd (an observer).
class Chatty final : public Plugin {
 public:
  std::string name() const override { return "chatty"; }
  std::vector<Event> events() const override { return {Event::AfterOptimizerStep, Event::BatchEnd}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::AfterOptimizerStep) {
      ctx.metrics->log(ctx.state.global_step, {{"chatty/steps", double(ctx.state.global_step)}});
      return;
    }
    throw std::runtime_error("disk full");
  }
};

TEST_F(PluginAuthors, PluginMetricsShareTheLineOfTheirStepAndObserverFailuresAreSummarised) {
  const RunResult r = run({"metrics.console=true"}, "run", {std::make_shared<Chatty>()});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;  // observer failures do not change the outcome
  const std::string log = read_file(tmp_ / "run/trainer.log");
  int lines_with_metric = 0;
  for (const auto& line : testing::read_lines_of(log)) {
    if (line.find("chatty/steps") == std::string::npos) continue;
    ++lines_with_metric;
    EXPECT_NE(line.find("train/loss"), std::string::npos) << line;  // one line per step, the core's metrics too
  }
  EXPECT_EQ(lines_with_metric, 4);
  // 4 failures: logged in full once, once more saying the rest are counted, then summarised.
  std::size_t full = 0;
  for (std::size_t at = log.find("failed in BatchEnd: disk full"); at != std::string::npos;
       at = log.find("failed in BatchEnd: disk full", at + 1)) {
    ++full;
  }
  EXPECT_EQ(full, 2u) << log;
  const std::string summary = "plugin 'chatty' failed 4 times in BatchEnd (first error: disk full)";
  EXPECT_NE(log.find(summary), std::string::npos) << log;
  EXPECT_NE(r.message.find(summary), std::string::npos) << r.message;
  EXPECT_NE(json_str(read_file(tmp_ / "run/status.json"), "message").find(summary), std::string::npos);
}

}  // namespace
}  // namespace trainer
