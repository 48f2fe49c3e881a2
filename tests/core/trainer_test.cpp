// The training loop end to end, through the real plugin .so files.
#include "trainer/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <csignal>

#include "support/test_util.h"

namespace trainer {
namespace {

using testing::json_num;
using testing::json_str;
using testing::metric_by_step;
using testing::read_file;
using testing::read_lines;
using testing::recorded_events;
using testing::write_file;

class TrainerRun : public testing::TrainerTest {
 protected:
  RunResult run(const std::vector<std::string>& overrides, const std::string& name = "run",
                const std::string& resume = "", std::vector<std::shared_ptr<Plugin>> extra = {}, bool signals = false) {
    std::vector<std::string> all = base_;
    all.insert(all.end(), overrides.begin(), overrides.end());
    TrainerOptions o = options_for(recipe_, all, name, extra);
    o.resume = resume;
    o.handle_signals = signals;
    Trainer t(std::move(o));
    RunResult r = t.fit();
    model_ = t.model();
    return r;
  }
  std::vector<std::string> events(const std::string& name = "run") {
    return recorded_events(tmp_ / (name + "/events.jsonl"));
  }
  std::shared_ptr<Model> model_;
  std::string recipe_ = testing::kSmallRun;
  /// Applied before each test's overrides: micro-batches of 16, the recording plugin.
  std::vector<std::string> base_ = {"training.micro_batch_size=16", "plugins.load=[\"recording\"]"};
};

TEST_F(TrainerRun, FiresEveryEventInOrderWithAccumulation) {
  const RunResult r = run({});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  std::vector<std::string> expected = {"Init",          "SelectDevice",     "ModelCreated",
                                       "ModelToDevice", "OptimizerCreated", "FitStart"};
  for (int epoch = 0; epoch < 2; ++epoch) {
    expected.push_back("EpochStart");
    for (int batch = 0; batch < 2; ++batch) {
      expected.push_back("BatchStart");
      for (int micro = 0; micro < 2; ++micro) {
        for (const char* e : {"BeforeForward", "AfterForward", "BeforeBackward", "AfterBackward"})
          expected.push_back(e);
      }
      for (const char* e : {"GradientsAccumulated", "BeforeOptimizerStep", "AfterOptimizerStep", "BatchEnd"})
        expected.push_back(e);
    }
    // The 32 test samples are one evaluation batch.
    for (const char* e :
         {"EvalStart", "EvalBatchStart", "EvalBatchEnd", "EvalMetrics", "EvalEnd", "EpochEnd", "Checkpoint"})
      expected.push_back(e);
  }
  expected.push_back("FitEnd");
  expected.push_back("Shutdown");
  EXPECT_EQ(events(), expected);
  EXPECT_EQ(r.global_step, 4);
}

TEST_F(TrainerRun, EvalAtEndEvaluatesAStopAtMaxStepsMidEpochOnce) {
  // 2 steps an epoch: max_steps 3 stops in the middle of the second epoch, where nothing
  // evaluates unless eval.at_end says so; limit_batches 1 of 8 evaluates 8 of the 32 samples.
  RunResult r = run(
      {"training.max_steps=3", "eval.every_epochs=0", "eval.at_end=true", "eval.batch_size=8", "eval.limit_batches=1"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  auto ev = events();
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "EvalStart"), 1);
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "EvalBatchStart"), 1);
  const auto acc = metric_by_step(tmp_ / "run/metrics.jsonl", "eval/accuracy");
  ASSERT_EQ(acc.size(), 1u);
  EXPECT_EQ(acc.begin()->first, 3);
  // Ending with the epoch's own evaluation: not evaluated twice.
  r = run({"eval.at_end=true"}, "full");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ev = events("full");
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "EvalStart"), 2);  // one per epoch
  // It is the default: the stop at max_steps is evaluated too; without it, it is not.
  r = run({"training.max_steps=3"}, "default");
  ev = events("default");
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "EvalStart"), 2);  // the first epoch's and the end's
  r = run({"training.max_steps=3", "eval.at_end=false"}, "plain");
  ev = events("plain");
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "EvalStart"), 1);  // the first epoch's
}

TEST_F(TrainerRun, MicroBatchCountsFollowTheSplit) {
  // 64 samples, batch 32, micro 12 -> micro-batches of 12, 12, 8 per step.
  ASSERT_EQ(run({"training.micro_batch_size=12", "training.epochs=1"}).exit_code, kExitOk);
  std::vector<long> sizes;
  for (const auto& l : read_lines(tmp_ / "run/events.jsonl")) {
    if (json_str(l, "event") == "BeforeForward") {
      sizes.push_back(static_cast<long>(*json_num(l, "samples")));
      EXPECT_EQ(*json_num(l, "num_micro_batches"), 3);
    }
  }
  EXPECT_EQ(sizes, (std::vector<long>{12, 12, 8, 12, 12, 8}));
}

TEST_F(TrainerRun, ContextHoldsModelAndOptimizerFromTheirEventsOn) {
  ASSERT_EQ(run({"training.epochs=1"}).exit_code, kExitOk);
  for (const auto& l : read_lines(tmp_ / "run/events.jsonl")) {
    const std::string e = json_str(l, "event");
    const bool has_model = l.find("\"has_model\":true") != std::string::npos;
    const bool has_opt = l.find("\"has_optimizer\":true") != std::string::npos;
    if (e == "Init" || e == "SelectDevice") {
      EXPECT_FALSE(has_model) << l;
    }
    if (e == "ModelCreated") {
      EXPECT_TRUE(has_model && !has_opt) << l;
    }
    if (e == "BatchStart") {
      EXPECT_TRUE(has_model && has_opt) << l;
    }
    if (e == "AfterForward") {
      EXPECT_TRUE(json_num(l, "loss").has_value()) << l;
    }
  }
}

std::vector<at::Tensor> params_of(const std::shared_ptr<Model>& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST_F(TrainerRun, AccumulatedGradientEqualsFullBatchGradient) {
  fix_threads();
  // One SGD step without momentum: the parameter change is -lr * gradient, so equal
  // parameters after the step mean equal gradients.
  const std::vector<std::string> common = {
      "training.max_steps=1",    "training.shuffle=false",   "optim.lr=0.5", "eval.every_epochs=0", "eval.at_end=false",
      "checkpoint.at_end=false", "checkpoint.every_epochs=0"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  ASSERT_EQ(run(with({"training.micro_batch_size=32"}), "full").exit_code, kExitOk);
  const auto full = params_of(model_);
  for (const char* micro : {"training.micro_batch_size=8", "training.micro_batch_size=12"}) {
    ASSERT_EQ(run(with({micro}), "acc" + std::string(micro).substr(26)).exit_code, kExitOk);
    const auto acc = params_of(model_);
    ASSERT_EQ(acc.size(), full.size());
    for (std::size_t i = 0; i < acc.size(); ++i) {
      EXPECT_TRUE(at::allclose(acc[i], full[i], 1e-5, 1e-6))
          << micro << " param " << i << " max diff " << (acc[i] - full[i]).abs().max().item<double>();
    }
  }
}

TEST_F(TrainerRun, ResumeReproducesTheLossesOfAnUninterruptedRun) {
  fix_threads();
  // AdamW (optimizer state) and dropout (RNG state) both have to be restored exactly.
  const std::vector<std::string> common = {"optim.name=adamw", "+model.dropout=0.2", "training.epochs=3",
                                           "training.batch_size=16", "training.micro_batch_size=16"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  ASSERT_EQ(run(with({}), "straight").exit_code, kExitOk);
  const auto straight = metric_by_step(tmp_ / "straight/metrics.jsonl", "train/loss");
  ASSERT_EQ(straight.size(), 12u);

  // Stop mid-epoch (step 6 of 4 per epoch = epoch 1, batch 2), then resume from the run dir.
  ASSERT_EQ(run(with({"training.max_steps=6"}), "part").exit_code, kExitOk);
  ASSERT_EQ(run(with({}), "resumed", tmp_ / "part").exit_code, kExitOk);
  const auto resumed = metric_by_step(tmp_ / "resumed/metrics.jsonl", "train/loss");
  ASSERT_EQ(resumed.size(), 6u);
  for (const auto& [step, loss] : resumed) {
    ASSERT_TRUE(straight.count(step)) << step;
    EXPECT_DOUBLE_EQ(loss, straight.at(step)) << "step " << step;
  }
}

TEST_F(TrainerRun, TrainsInTheModelDtypeAndResumesInIt) {
  for (const auto& [name, dtype] : {std::pair{"float64", c10::kDouble}, std::pair{"bfloat16", c10::kBFloat16}}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string("run_") + name;
    const RunResult r = run({std::string("+model.dtype=") + name}, dir);
    ASSERT_EQ(r.exit_code, kExitOk) << r.message;
    for (const auto& p : model_->parameters()) EXPECT_EQ(p.scalar_type(), dtype);
    // Finite losses, not a particular accuracy: bf16 rounds differently where the CPU has it
    // natively, and 32 randomly labelled samples can all be missed.
    EXPECT_TRUE(std::isfinite(r.final_metrics.at("train/loss")));
    EXPECT_TRUE(std::isfinite(r.final_metrics.at("eval/loss")));
    const RunResult again =
        run({std::string("+model.dtype=") + name, "training.epochs=3"}, dir + "_resumed", tmp_ / dir);
    ASSERT_EQ(again.exit_code, kExitOk) << again.message;
    EXPECT_EQ(again.global_step, 6);
  }
}

TEST_F(TrainerRun, SameSeedGivesTheSameLosses) {
  fix_threads();
  ASSERT_EQ(run({"+model.dropout=0.1"}, "a").exit_code, kExitOk);
  ASSERT_EQ(run({"+model.dropout=0.1"}, "b").exit_code, kExitOk);
  EXPECT_EQ(metric_by_step(tmp_ / "a/metrics.jsonl", "train/loss"),
            metric_by_step(tmp_ / "b/metrics.jsonl", "train/loss"));
}

TEST_F(TrainerRun, ObserverPluginFailureDoesNotStopTheRun) {
  const RunResult r = run({"plugins.load=[\"recording\", \"throwing\"]", "plugins.throwing.event=\"BatchEnd\""});
  EXPECT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 4);
  // It really threw, at every BatchEnd: logged in full twice (the second time saying the rest
  // are counted), then counted and summarised.
  const std::string log = read_file(tmp_ / "run/trainer.log");
  std::size_t failures = 0;
  for (std::size_t at = 0;
       (at = log.find("plugin 'throwing' failed in BatchEnd: injected failure", at)) != std::string::npos; ++at)
    ++failures;
  EXPECT_EQ(failures, 2u) << log;
  EXPECT_NE(r.message.find("plugin 'throwing' failed 4 times in BatchEnd (first error: injected failure at step 1)"),
            std::string::npos)
      << r.message;
}

TEST_F(TrainerRun, EssentialPluginFailureFailsTheRunCleanly) {
  const RunResult r =
      run({"plugins.load=[\"recording\", \"throwing\"]", "+plugins.throwing.event=\"AfterOptimizerStep\"",
           "+plugins.throwing.at_step=3", "+plugins.throwing.policy=\"essential\""});
  EXPECT_EQ(r.exit_code, kExitTrainingFailed);
  EXPECT_EQ(r.status, RunStatus::Failed);
  EXPECT_NE(r.message.find("plugin 'throwing' failed in AfterOptimizerStep: injected failure at step 3"),
            std::string::npos)
      << r.message;
  const auto ev = events();
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev[ev.size() - 3], "Checkpoint");  // the failure checkpoint comes first
  EXPECT_EQ(ev[ev.size() - 2], "Exception");
  EXPECT_EQ(ev.back(), "Shutdown");
  EXPECT_NE(read_file(tmp_ / "run/status.json").find("\"status\":\"FAILED\""), std::string::npos);
  EXPECT_FALSE(r.last_checkpoint.empty());
  EXPECT_TRUE(std::filesystem::exists(r.last_checkpoint));
  // The step that was taken before the failure is not trained again after a resume.
  const RunResult resumed = run({}, "resumed", tmp_ / "run");
  ASSERT_EQ(resumed.exit_code, kExitOk) << resumed.message;
  EXPECT_EQ(resumed.global_step, 4);
  EXPECT_EQ(metric_by_step(tmp_ / "resumed/metrics.jsonl", "train/loss").size(), 1u);
}

/// Raises a real SIGINT after the given optimizer step.
class SignalAtStep final : public Plugin {
 public:
  explicit SignalAtStep(std::int64_t step) : step_(step) {}
  std::string name() const override { return "signal_at_step"; }
  std::vector<Event> events() const override { return {Event::BatchEnd}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.state.global_step == step_) std::raise(SIGINT);
  }

 private:
  std::int64_t step_;
};

TEST_F(TrainerRun, SigintStopsAtASafePointWithACheckpoint) {
  clear_interrupt();
  const RunResult r = run({"training.epochs=3"}, "run", "", {std::make_shared<SignalAtStep>(3)}, /*signals=*/true);
  clear_interrupt();
  EXPECT_EQ(r.exit_code, kExitInterrupted);
  EXPECT_EQ(r.status, RunStatus::Killed);
  EXPECT_EQ(r.global_step, 3);
  EXPECT_NE(r.last_checkpoint.find("step_00000003.pt"), std::string::npos) << r.last_checkpoint;
  EXPECT_EQ(events().back(), "Shutdown");
  EXPECT_NE(read_file(tmp_ / "run/status.json").find("\"exit_code\":130"), std::string::npos);
}

TEST_F(TrainerRun, WritesTheRunDirectory) {
  ASSERT_EQ(run({}).exit_code, kExitOk);
  EXPECT_NE(read_file(tmp_ / "run/config.toml").find("micro_batch_size = 16"), std::string::npos);
  EXPECT_FALSE(read_lines(tmp_ / "run/metrics.jsonl").empty());
  EXPECT_TRUE(std::filesystem::exists(tmp_ / "run/trainer.log"));
  EXPECT_EQ(testing::read_file(tmp_ / "run/checkpoints/latest"), "step_00000004.pt\n");
  EXPECT_NE(read_file(tmp_ / "run/status.json").find("\"status\":\"FINISHED\""), std::string::npos);
  // keep_last = 2 by default: both epoch checkpoints are there, nothing else.
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp_ / "run/checkpoints"))
    n += e.path().extension() == ".pt";
  EXPECT_EQ(n, 2);
}

TEST_F(TrainerRun, KeepLastPrunesOldCheckpoints) {
  ASSERT_EQ(run({"checkpoint.every_steps=1", "checkpoint.keep_last=2"}).exit_code, kExitOk);
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(tmp_ / "run/checkpoints"))
    files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  // Steps 1 to 4 were written; the newest two remain with their digests, latest names the newest.
  EXPECT_EQ(files, (std::vector<std::string>{"latest", "step_00000003.pt", "step_00000003.pt.sum", "step_00000004.pt",
                                             "step_00000004.pt.sum"}));
  EXPECT_EQ(read_file(tmp_ / "run/checkpoints/latest"), "step_00000004.pt\n");
}

TEST_F(TrainerRun, ResumeFromAMissingCheckpointIsAUsageError) {
  const RunResult r = run({}, "run", tmp_ / "nowhere");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("nowhere"), std::string::npos) << r.message;
}

TEST_F(TrainerRun, LearnsFashionMnistSliceWellAboveChance) {
  const std::string text = R"(
[model]
name = "mlp"
hidden = [128]
[dataset]
name = "fashion_mnist"
limit = 3000
eval_limit = 1000
[training]
epochs = 2
batch_size = 64
micro_batch_size = 32
[optim]
name = "sgd"
lr = 0.05
momentum = 0.9
[metrics]
console = false
[plugins]
load = ["recording"]
)";
  recipe_ = text;
  base_.clear();
  const RunResult r = run({});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_GT(r.final_metrics.at("eval/accuracy"), 0.65);  // chance is 0.10
}

}  // namespace
}  // namespace trainer
