// The mixed_precision and grad_checkpoint plugins (.so) in real runs of a tiny ViT: autocast
// covers exactly the forwards and never outlives one (also after an out-of-memory error inside
// the forward); the GradScaler skips a step whose gradients overflowed, backs off, grows, counts
// a retried batch once and resumes its state; checkpointed training equals plain training; an
// OOM retry with both plugins gives the parameters of a run without one. Every OOM here is a
// real allocation refused by the CPU memory budget.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "support/inject_inf.h"
#include "support/test_util.h"
#include "trainer/memory.h"
#include "trainer/precision.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::InjectInf;
using testing::max_abs_diff;
using testing::metric_by_step;

const c10::Device kCpu(c10::kCPU);

constexpr const char* kRecipe = R"(
[run]
seed = 11
[model]
name = "vit"
patch_size = 4
num_layers = 2
hidden_dim = 32
num_heads = 2
mlp_dim = 64
[dataset]
name = "synthetic"
size = 128
eval_size = 32
shape = [1, 28, 28]
[training]
epochs = 1
batch_size = 32
log_every = 1
[optim]
name = "sgd"
lr = 0.05
[eval]
every_epochs = 1
[checkpoint]
every_epochs = 1
[metrics]
console = false
[plugins]
load = ["mixed_precision"]
)";

/// Records the autocast state and dtypes around the forwards: inside its own forward scope
/// (opened after mixed_precision's), after each forward, at OutOfMemory and at EvalStart.
class AutocastProbe final : public Plugin {
 public:
  std::string name() const override { return "autocast_probe"; }
  std::vector<Event> events() const override {
    return {Event::AfterForward, Event::EvalBatchEnd, Event::OutOfMemory, Event::EvalStart, Event::BatchEnd};
  }
  int default_priority() const override { return 2000; }  // its scope opens inside mixed_precision's (1000)
  std::unique_ptr<ForwardScope> forward_scope(const EventContext& ctx) override {
    (ctx.event == Event::BeforeForward ? inside_train : inside_eval).push_back(autocast_state());
    return nullptr;
  }
  void on_event(EventContext& ctx, Control&) override {
    switch (ctx.event) {
      case Event::AfterForward:
        train_outputs.push_back(ctx.outputs->scalar_type());
        after_forward.push_back(autocast_state());
        break;
      case Event::EvalBatchEnd:
        eval_outputs.push_back(ctx.outputs->scalar_type());
        break;
      default:
        elsewhere.push_back(autocast_state());
        break;
    }
  }
  std::vector<AutocastState> inside_train, inside_eval, after_forward, elsewhere;
  std::vector<c10::ScalarType> train_outputs, eval_outputs;
};

/// Makes the first attempt of step `step` run out of memory right after `at` (a real refused
/// allocation: the budget is set to what is in use plus 1 KiB) and, at OutOfMemory, lifts the
/// budget, records the autocast state and asks for a retry at the same micro-batch or half.
class Squeeze final : public Plugin {
 public:
  Squeeze(Event at, std::int64_t step, bool half) : at_(at), step_(step), half_(half) {}
  std::string name() const override { return "squeeze"; }
  std::vector<Event> events() const override { return {at_, Event::OutOfMemory, Event::BatchStart}; }
  int default_priority() const override { return -100; }
  void on_event(EventContext& ctx, Control& c) override {
    if (ctx.event == Event::OutOfMemory) {
      set_memory_limit(kCpu, 0);
      phases.push_back(oom_phase_name(ctx.oom->phase));
      at_oom.push_back(autocast_state());
      c.retry_with_micro_batch = half_ ? ctx.oom->micro_batch_size / 2 : ctx.oom->micro_batch_size;
      return;
    }
    if (ctx.event == Event::BatchStart) {
      if (half_ && configured_ > 0) c.micro_batch_size = configured_;  // back after the retried batch
      if (configured_ == 0) configured_ = ctx.state.micro_batch_size;
      done_this_batch_ = false;
      return;
    }
    if (ctx.state.global_step == step_ && !done_this_batch_ && ctx.state.micro_batch_index == 0) {
      done_this_batch_ = true;
      set_memory_limit(kCpu, memory_stats(kCpu).allocated + 1024);
    }
  }
  std::vector<std::string> phases;
  std::vector<AutocastState> at_oom;

 private:
  Event at_;
  std::int64_t step_;
  bool half_;
  std::int64_t configured_ = 0;
  bool done_this_batch_ = false;
};

/// Draws the head at random in ModelCreated: the ViT starts it at zero (as torchvision), and
/// then the first step's gradient reaches no block.
class RandomHead final : public Plugin {
 public:
  std::string name() const override { return "random_head"; }
  std::vector<Event> events() const override { return {Event::ModelCreated}; }
  void on_event(EventContext& ctx, Control&) override {
    torch::NoGradGuard no_grad;
    for (auto& p : ctx.model->named_parameters()) {
      if (p.key().rfind("heads.", 0) == 0) p.value().normal_(0.0, 0.1);
    }
  }
};

class PrecisionPlugins : public testing::TrainerTest {
 protected:
  void TearDown() override { set_memory_limit(kCpu, 0); }
  RunResult run(const std::string& name, std::vector<std::string> overrides,
                std::vector<std::shared_ptr<Plugin>> extra = {}) {
    Trainer t(options_for(kRecipe, overrides, name, std::move(extra)));
    RunResult r = t.fit();
    params_.clear();
    if (t.model()) {
      for (const auto& p : t.model()->parameters()) params_.push_back(p.detach().clone());
    }
    return r;
  }
  std::vector<at::Tensor> params_;
};

TEST_F(PrecisionPlugins, Bf16AutocastCoversEveryForwardTrainingAndEvaluationAndNothingElse) {
  auto probe = std::make_shared<AutocastProbe>();
  const RunResult r = run("bf16", {"+plugins.mixed_precision.precision=\"bf16\""}, {probe});
  ASSERT_EQ(r.status, RunStatus::Finished) << r.message;
  ASSERT_EQ(probe->inside_train.size(), 4u);
  for (const auto& s : probe->inside_train) EXPECT_TRUE(s.cpu_enabled && s.cpu_dtype == c10::kBFloat16);
  ASSERT_FALSE(probe->inside_eval.empty());
  for (const auto& s : probe->inside_eval) EXPECT_TRUE(s.cpu_enabled && s.cpu_dtype == c10::kBFloat16);
  for (auto t : probe->train_outputs) EXPECT_EQ(t, c10::kBFloat16);
  for (auto t : probe->eval_outputs) EXPECT_EQ(t, c10::kBFloat16);
  for (const auto& s : probe->after_forward) EXPECT_FALSE(s.cpu_enabled);
  for (const auto& s : probe->elsewhere) EXPECT_FALSE(s.cpu_enabled);
  EXPECT_TRUE(std::isfinite(r.final_metrics.at("train/loss")));
  EXPECT_TRUE(std::isfinite(r.final_metrics.at("eval/loss")));
  EXPECT_EQ(autocast_state(), AutocastState{});
}

TEST_F(PrecisionPlugins, AutoRunsBf16ExactlyWhereTheCpuHasNativeBf16) {
  auto probe = std::make_shared<AutocastProbe>();
  const bool native = native_bf16(kCpu);
  const RunResult r = run("auto", {}, {probe});  // precision = "auto" by default
  ASSERT_EQ(r.status, RunStatus::Finished) << r.message;
  for (const auto& s : probe->inside_train) EXPECT_EQ(s.cpu_enabled, native);
  for (auto t : probe->train_outputs) EXPECT_EQ(t, native ? c10::kBFloat16 : c10::kFloat);
}

TEST_F(PrecisionPlugins, AnOomInsideTheForwardLeavesAutocastOffForTheRetryAndTheEvaluation) {
  auto probe = std::make_shared<AutocastProbe>();
  auto squeeze = std::make_shared<Squeeze>(Event::BeforeForward, 1, /*half=*/true);
  const RunResult r = run("oom", {"+plugins.mixed_precision.precision=\"bf16\""}, {squeeze, probe});
  ASSERT_EQ(r.status, RunStatus::Finished) << r.message;
  ASSERT_EQ(squeeze->phases, std::vector<std::string>{"forward"});
  EXPECT_FALSE(squeeze->at_oom.at(0).cpu_enabled);
  for (const auto& s : probe->elsewhere) EXPECT_FALSE(s.cpu_enabled);  // OutOfMemory, EvalStart, BatchEnd
  // The retry (two micro-batches of 16) ran under autocast again.
  EXPECT_EQ(probe->inside_train.size(), 4u + 2u);
  for (const auto& s : probe->inside_train) EXPECT_TRUE(s.cpu_enabled);
  EXPECT_EQ(r.global_step, 4);
}

TEST_F(PrecisionPlugins, AnInfGradientSkipsTheStepWithParametersBitIdenticalAndHalvesTheScale) {
  auto inject = std::make_shared<InjectInf>(1);
  const RunResult r = run("inf",
                          {"+plugins.mixed_precision.precision=\"fp32\"", "+plugins.mixed_precision.grad_scaler=\"on\"",
                           "+plugins.mixed_precision.init_scale=1024"},
                          {inject});
  ASSERT_EQ(r.status, RunStatus::Finished) << r.message;
  ASSERT_FALSE(inject->before.empty());
  ASSERT_EQ(inject->before.size(), inject->after.size());
  for (std::size_t i = 0; i < inject->before.size(); ++i) {
    EXPECT_TRUE(torch::equal(inject->before[i], inject->after[i])) << "parameter " << i << " changed";
  }
  EXPECT_EQ(r.global_step, 3);  // 4 batches, one step skipped
  EXPECT_EQ(r.final_metrics.at("amp/loss_scale"), 512.0);
  EXPECT_EQ(r.final_metrics.at("amp/skipped_steps"), 1.0);
}

TEST_F(PrecisionPlugins, TheScaleGrowsAfterTheIntervalAndARetriedBatchCountsOnce) {
  fix_threads();
  // The first attempt of step 0 runs out of memory in the optimizer step, after its gradients
  // were unscaled; the retry computes and unscales its own. Growth after 2 clean steps.
  const std::vector<std::string> scaler = {
      "+plugins.mixed_precision.precision=\"fp32\"", "+plugins.mixed_precision.grad_scaler=\"on\"",
      "+plugins.mixed_precision.init_scale=8", "+plugins.mixed_precision.growth_interval=2"};
  const RunResult clean = run("clean", scaler);
  ASSERT_EQ(clean.status, RunStatus::Finished) << clean.message;
  const auto clean_params = params_;
  auto squeeze = std::make_shared<Squeeze>(Event::BeforeOptimizerStep, 0, /*half=*/false);
  const RunResult r = run("grow", scaler, {squeeze});
  ASSERT_EQ(r.status, RunStatus::Finished) << r.message;
  ASSERT_EQ(squeeze->phases, std::vector<std::string>{"optimizer_step"});
  const auto scale = metric_by_step(tmp_ / "grow/metrics.jsonl", "amp/loss_scale");
  EXPECT_EQ(scale.at(1), 8.0) << "the retried batch counted as two clean steps";
  EXPECT_EQ(scale.at(2), 16.0);
  EXPECT_EQ(scale.at(3), 16.0);
  EXPECT_EQ(scale.at(4), 32.0);
  // The retry's step used gradients unscaled exactly once: the run without the OOM's parameters.
  EXPECT_LE(max_abs_diff(clean_params, params_), 1e-6);
}

TEST_F(PrecisionPlugins, TheScalersStateRoundTripsThroughACheckpoint) {
  fix_threads();
  const std::vector<std::string> scaler = {
      "+plugins.mixed_precision.precision=\"fp32\"", "+plugins.mixed_precision.grad_scaler=\"on\"",
      "+plugins.mixed_precision.init_scale=8", "+plugins.mixed_precision.growth_interval=3", "dataset.size=64"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), scaler.begin(), scaler.end());
    return extra;
  };
  // 2 steps per epoch: growth at the third clean step, which the resumed run takes.
  const RunResult whole = run("whole", with({"training.epochs=2"}));
  ASSERT_EQ(whole.status, RunStatus::Finished) << whole.message;
  EXPECT_EQ(whole.final_metrics.at("amp/loss_scale"), 16.0);
  const auto whole_params = params_;
  const RunResult first = run("split", with({"training.epochs=1"}));
  ASSERT_EQ(first.status, RunStatus::Finished) << first.message;
  EXPECT_EQ(first.final_metrics.at("amp/loss_scale"), 8.0);
  TrainerOptions o = options_for(kRecipe, with({"training.epochs=2"}), "resumed");
  o.resume = tmp_ / "split";
  Trainer t(std::move(o));
  const RunResult resumed = t.fit();
  ASSERT_EQ(resumed.status, RunStatus::Finished) << resumed.message;
  EXPECT_EQ(resumed.final_metrics.at("amp/loss_scale"), 16.0) << "the growth count did not survive the resume";
  std::size_t i = 0;
  for (const auto& p : t.model()->parameters()) EXPECT_TRUE(torch::equal(p, whole_params.at(i++)));
}

TEST_F(PrecisionPlugins, Fp16OnTheCpuIsAUsageErrorNamingWhatToUse) {
  const RunResult r = run("fp16", {"+plugins.mixed_precision.precision=\"fp16\""});
  EXPECT_EQ(r.status, RunStatus::Failed);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("needs a CUDA device"), std::string::npos) << r.message;
}

TEST_F(PrecisionPlugins, CheckpointedTrainingWithDropoutEqualsPlainTraining) {
  fix_threads();
  const std::vector<std::string> dropout = {"model.dropout=0.1", "model.attention_dropout=0.1", "plugins.load=[]"};
  const RunResult plain = run("plain", dropout, {std::make_shared<RandomHead>()});
  ASSERT_EQ(plain.status, RunStatus::Finished) << plain.message;
  const auto plain_params = params_;
  auto ckpt_overrides = dropout;
  ckpt_overrides.back() = "plugins.load=[\"grad_checkpoint\"]";
  const RunResult ckpt = run("ckpt", ckpt_overrides, {std::make_shared<RandomHead>()});
  ASSERT_EQ(ckpt.status, RunStatus::Finished) << ckpt.message;
  EXPECT_LE(max_abs_diff(plain_params, params_), 1e-6);
  EXPECT_NEAR(plain.final_metrics.at("eval/loss"), ckpt.final_metrics.at("eval/loss"), 1e-6);
}

TEST_F(PrecisionPlugins, GradCheckpointOnAModelWithoutBlocksIsAUsageError) {
  std::string cnn = kRecipe;
  cnn.replace(cnn.find("name = \"vit\""), cnn.find("[dataset]") - cnn.find("name = \"vit\""), "name = \"cnn\"\n");
  Trainer t(options_for(cnn, {"plugins.load=[\"grad_checkpoint\"]"}, "cnn"));
  const RunResult r = t.fit();
  EXPECT_EQ(r.status, RunStatus::Failed);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("model 'cnn' exposes no blocks"), std::string::npos) << r.message;
}

TEST_F(PrecisionPlugins, AnOomRetryWithBothPluginsGivesTheParametersOfARunWithoutOne) {
  fix_threads();
  const std::vector<std::string> both = {"plugins.load=[\"mixed_precision\", \"grad_checkpoint\"]",
                                         "+plugins.mixed_precision.precision=\"bf16\""};
  const RunResult clean = run("clean", both, {std::make_shared<RandomHead>()});
  ASSERT_EQ(clean.status, RunStatus::Finished) << clean.message;
  const auto clean_params = params_;
  // Out of memory inside the second batch's checkpointed forward under autocast; retried.
  auto squeeze = std::make_shared<Squeeze>(Event::BeforeForward, 1, /*half=*/false);
  const RunResult retried = run("retried", both, {squeeze, std::make_shared<RandomHead>()});
  ASSERT_EQ(retried.status, RunStatus::Finished) << retried.message;
  ASSERT_EQ(squeeze->phases, std::vector<std::string>{"forward"});
  EXPECT_LE(max_abs_diff(clean_params, params_), 1e-6);
  // Half the micro-batch (gradient accumulation) in float32: the same up to summation order.
  const std::vector<std::string> fp32 = {"plugins.load=[\"mixed_precision\", \"grad_checkpoint\"]",
                                         "+plugins.mixed_precision.precision=\"fp32\""};
  run("clean32", fp32, {std::make_shared<RandomHead>()});
  const auto clean32 = params_;
  auto halve = std::make_shared<Squeeze>(Event::BeforeForward, 1, /*half=*/true);
  const RunResult halved = run("halved", fp32, {halve, std::make_shared<RandomHead>()});
  ASSERT_EQ(halved.status, RunStatus::Finished) << halved.message;
  ASSERT_EQ(halve->phases, std::vector<std::string>{"forward"});
  EXPECT_LE(max_abs_diff(clean32, params_), 1e-5);
}

}  // namespace
}  // namespace trainer
