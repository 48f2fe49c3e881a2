// Out-of-memory recovery end to end, on CPU, through the memory budget: every OOM here is a
// real allocation refused by the tracking allocator, recovered by the core and the real
// oom_backoff .so (or an in-process policy where the test needs exact control).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "support/refusing_data.h"
#include "support/sample_ledger.h"
#include "support/test_util.h"
#include "trainer/memory.h"
#include "trainer/run_records.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::read_file;
using testing::SampleLedger;
using testing::write_file;

const c10::Device kCpu(c10::kCPU);

// A small CNN without BatchNorm (so accumulation is exact) whose activations dominate its
// parameters: micro-batch size really changes the memory a step needs.
constexpr const char* kRecipe = R"(
[run]
seed = 11
[model]
name = "cnn"
channels = [8, 16]
hidden = 32
batch_norm = false
dropout = 0.0
[dataset]
name = "synthetic"
size = 256
eval_size = 64
[training]
epochs = 1
batch_size = 64
micro_batch_size = 64
log_every = 1
[optim]
name = "sgd"
lr = 0.05
[eval]
every_epochs = 0
at_end = false
[metrics]
console = false
[plugins]
load = ["oom_backoff", "recording"]
)";

/// Makes the next allocation after `event` fail: sets the budget to what is in use plus
/// 1 KiB, for the steps in `steps` (first attempt only; for per-micro-batch events at
/// micro-batch `at_micro`, after the earlier ones accumulated their gradients), and lifts it
/// when OutOfMemory fires.
/// Optionally acts as the policy itself: retry with half the micro-batch (restoring the
/// configured size at the next batch), or with the same size.
class Squeeze final : public Plugin {
 public:
  enum class Policy { None, Half, Same };
  Squeeze(Event at, std::set<std::int64_t> steps, Policy policy = Policy::None, std::int64_t at_micro = 0)
      : at_(at), steps_(std::move(steps)), policy_(policy), at_micro_(at_micro) {}
  std::string name() const override { return "squeeze"; }
  std::vector<Event> events() const override {
    return {at_, Event::OutOfMemory, Event::BatchStart, Event::BatchEnd, Event::EvalEnd, Event::FitEnd};
  }
  int default_priority() const override { return -10; }  // before oom_backoff
  void on_event(EventContext& ctx, Control& c) override {
    if (ctx.event == Event::OutOfMemory) {
      set_memory_limit(kCpu, 0);
      phases.push_back(oom_phase_name(ctx.oom->phase));
      if (policy_ == Policy::Half) c.retry_with_micro_batch = std::max<std::int64_t>(1, ctx.oom->micro_batch_size / 2);
      if (policy_ == Policy::Same) c.retry_with_micro_batch = ctx.oom->micro_batch_size;
      return;
    }
    if (ctx.event == Event::BatchStart) {
      attempted_this_batch_ = false;
      if (policy_ == Policy::Half && configured_ > 0) c.micro_batch_size = configured_;
      if (configured_ == 0) configured_ = ctx.state.micro_batch_size;
    }
    if (ctx.event == Event::BatchEnd) allocated_at_batch_end.push_back(memory_stats(kCpu).allocated);
    const bool per_micro = at_ == Event::BeforeForward || at_ == Event::BeforeBackward;
    if (ctx.event == at_ && !attempted_this_batch_ && steps_.count(ctx.state.global_step) &&
        (!per_micro || ctx.state.micro_batch_index == at_micro_)) {
      attempted_this_batch_ = true;
      set_memory_limit(kCpu, memory_stats(kCpu).allocated + 1024);
    }
  }
  std::vector<std::string> phases;
  std::vector<std::int64_t> allocated_at_batch_end;

 private:
  Event at_;
  std::set<std::int64_t> steps_;
  Policy policy_;
  std::int64_t at_micro_ = 0;
  bool attempted_this_batch_ = false;
  std::int64_t configured_ = 0;
};

/// Snapshots the parameters at BeforeOptimizerStep and compares them at OutOfMemory.
class StepGuardProbe final : public Plugin {
 public:
  std::string name() const override { return "step_probe"; }
  std::vector<Event> events() const override { return {Event::BeforeOptimizerStep, Event::OutOfMemory}; }
  int default_priority() const override { return -20; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::BeforeOptimizerStep) {
      before_.clear();
      for (const auto& p : ctx.model->parameters()) before_.push_back(p.detach().clone());
      return;
    }
    if (ctx.oom->phase != OomPhase::OptimizerStep) return;
    ++checked;
    std::size_t i = 0;
    for (const auto& p : ctx.model->parameters()) identical = identical && torch::equal(p, before_.at(i++));
  }
  int checked = 0;
  bool identical = true;

 private:
  std::vector<at::Tensor> before_;
};

class Oom : public testing::TrainerTest {
 protected:
  void TearDown() override { set_memory_limit(kCpu, 0); }
  RunResult run(const std::string& name, std::vector<std::string> overrides,
                std::vector<std::shared_ptr<Plugin>> extra = {}, const std::string& log_level = "error") {
    TrainerOptions o = options_for(recipe_, overrides, name, extra);
    o.log_level = log_level;
    Trainer t(std::move(o));
    RunResult r = t.fit();
    params_.clear();
    if (t.model()) {
      for (const auto& p : t.model()->parameters()) params_.push_back(p.detach().clone());
    }
    return r;
  }
  void expect_params_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6))
          << "param " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>();
    }
  }
  std::string recipe_ = kRecipe;
  std::vector<at::Tensor> params_;
};

TEST_F(Oom, RecoversInEveryTrainingPhaseWithTheSameResult) {
  fix_threads();
  ASSERT_EQ(run("clean", {}).exit_code, kExitOk);
  const auto reference = params_;
  const std::vector<std::pair<Event, std::string>> phases = {{Event::BatchStart, "data"},
                                                             {Event::BeforeForward, "forward"},
                                                             {Event::BeforeBackward, "backward"},
                                                             {Event::BeforeOptimizerStep, "optimizer_step"}};
  for (const auto& [event, phase] : phases) {
    SCOPED_TRACE(phase);
    auto squeeze = std::make_shared<Squeeze>(event, std::set<std::int64_t>{1, 2});
    const RunResult r = run(phase, {}, {squeeze});
    ASSERT_EQ(r.exit_code, kExitOk) << r.message;
    EXPECT_EQ(r.global_step, 4);
    EXPECT_EQ(squeeze->phases, (std::vector<std::string>{phase, phase}));
    expect_params_close(params_, reference);
  }
}

TEST_F(Oom, EverySampleContributesExactlyOncePerEpoch) {
  fix_threads();
  ASSERT_EQ(run("clean", {"training.epochs=2"}).exit_code, kExitOk);
  const auto reference = params_;
  auto ledger = std::make_shared<SampleLedger>();
  auto squeeze = std::make_shared<Squeeze>(Event::BeforeBackward, std::set<std::int64_t>{0, 1, 2, 3});
  const RunResult r = run("run", {"training.epochs=2"}, {squeeze, ledger});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(squeeze->phases.size(), 4u);
  EXPECT_EQ(r.global_step, 8);  // no step lost or doubled
  const std::vector<std::int64_t> committed = ledger->committed();
  ASSERT_EQ(committed.size(), 512u);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::int64_t> seen(committed.begin() + epoch * 256, committed.begin() + (epoch + 1) * 256);
    std::sort(seen.begin(), seen.end());
    for (std::int64_t i = 0; i < 256; ++i) ASSERT_EQ(seen[i], i) << "epoch " << epoch;
  }
  // No gradient of a failed attempt reached a step: the parameters are those of the run
  // without out-of-memory errors.
  expect_params_close(params_, reference);
}

TEST_F(Oom, AnOomAfterMicroBatchesAccumulatedDropsTheirGradients) {
  fix_threads();
  // Four micro-batches of 16; the OOM hits the backward of the third, when two have already
  // added their gradients. The retry starts from zero gradients, in micro-batches of 8.
  ASSERT_EQ(run("clean", {"training.micro_batch_size=16"}).exit_code, kExitOk);
  const auto reference = params_;
  for (const Event at : {Event::BeforeBackward, Event::BeforeForward}) {
    SCOPED_TRACE(event_name(at));
    auto squeeze = std::make_shared<Squeeze>(at, std::set<std::int64_t>{0, 2}, Squeeze::Policy::Half, 2);
    const RunResult r = run(std::string(event_name(at)), {"training.micro_batch_size=16"}, {squeeze});
    ASSERT_EQ(r.exit_code, kExitOk) << r.message;
    EXPECT_EQ(squeeze->phases.size(), 2u);
    EXPECT_EQ(r.global_step, 4);
    expect_params_close(params_, reference);
  }
}

TEST_F(Oom, OptimizerStepOomLeavesParametersBitIdentical) {
  fix_threads();
  ASSERT_EQ(run("clean", {"optim.name=adamw"}).exit_code, kExitOk);
  const auto reference = params_;
  // Retrying at the same micro-batch size repeats the exact computation, so any change the
  // failed step made to parameters or AdamW's state would show in the final parameters.
  auto squeeze =
      std::make_shared<Squeeze>(Event::BeforeOptimizerStep, std::set<std::int64_t>{0, 2}, Squeeze::Policy::Same);
  auto probe = std::make_shared<StepGuardProbe>();
  const RunResult r = run("oom", {"optim.name=adamw", "plugins.load=[\"recording\"]"}, {squeeze, probe});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(probe->checked, 2);
  EXPECT_TRUE(probe->identical);
  ASSERT_EQ(params_.size(), reference.size());
  for (std::size_t i = 0; i < params_.size(); ++i) EXPECT_TRUE(torch::equal(params_[i], reference[i])) << i;
}

TEST_F(Oom, AllocatedMemoryReturnsToTheBaselineAfter20Recoveries) {
  recipe_ = std::string(kRecipe);
  const std::string size = "size = 256";
  recipe_.replace(recipe_.find(size), size.size(), "size = 1344");  // 21 steps
  auto clean = std::make_shared<Squeeze>(Event::BeforeForward, std::set<std::int64_t>{}, Squeeze::Policy::Half);
  ASSERT_EQ(run("clean", {}, {clean}).exit_code, kExitOk);
  std::set<std::int64_t> steps;
  for (std::int64_t s = 1; s <= 20; ++s) steps.insert(s);
  auto squeeze = std::make_shared<Squeeze>(Event::BeforeForward, steps, Squeeze::Policy::Half);
  const RunResult r = run("oom", {}, {squeeze});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(squeeze->phases.size(), 20u);
  ASSERT_EQ(squeeze->allocated_at_batch_end.size(), 21u);
  // Step 0 had no OOM; after each of the 20 recoveries the memory in use is back exactly there.
  for (std::size_t s = 1; s < 21; ++s)
    EXPECT_EQ(squeeze->allocated_at_batch_end[s], squeeze->allocated_at_batch_end[0]) << s;
  EXPECT_EQ(clean->allocated_at_batch_end.size(), 21u);
}

/// Keeps micro-batches above 16 from fitting until step `until`, then "frees" the memory.
class TightUntil final : public Plugin {
 public:
  explicit TightUntil(std::int64_t until) : until_(until) {}
  std::string name() const override { return "tight_until"; }
  std::vector<Event> events() const override { return {Event::BeforeForward, Event::OutOfMemory, Event::BatchStart}; }
  int default_priority() const override { return -10; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::BatchStart) micro_at_start.push_back(ctx.state.micro_batch_size);
    if (ctx.event == Event::OutOfMemory) set_memory_limit(kCpu, 0);
    if (ctx.event == Event::BeforeForward && ctx.state.global_step < until_ && ctx.state.micro_batch_size > 16 &&
        ctx.state.micro_batch_index == 0) {
      set_memory_limit(kCpu, memory_stats(kCpu).allocated + 1024);
    }
  }
  std::vector<std::int64_t> micro_at_start;

 private:
  std::int64_t until_;
};

TEST_F(Oom, GrowsBackToTheConfiguredMicroBatchOnceMemoryFreesUp) {
  auto tight = std::make_shared<TightUntil>(6);
  const RunResult r = run("run", {"dataset.size=2048", "+plugins.oom_backoff.grow_after=2"}, {tight});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(tight->micro_at_start.size(), 32u);
  EXPECT_EQ(tight->micro_at_start[1], 16);      // backed off 64 -> 32 -> 16
  EXPECT_EQ(tight->micro_at_start.back(), 64);  // and grew back to the configured size
}

/// The CPU memory limit in force at each BatchEnd.
class LimitProbe final : public Plugin {
 public:
  std::string name() const override { return "limit_probe"; }
  std::vector<Event> events() const override { return {Event::BatchEnd}; }
  void on_event(EventContext&, Control&) override { limits.push_back(memory_stats(kCpu).limit); }
  std::vector<std::int64_t> limits;
};

TEST_F(Oom, TheBudgetEndsWithTheRun) {
  auto probe = std::make_shared<LimitProbe>();
  const RunResult r = run("run", {"+memory.limit_mb=64"}, {probe});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(probe->limits, std::vector<std::int64_t>(4, std::int64_t{64} << 20));  // in force during the run
  EXPECT_EQ(memory_stats(kCpu).limit, 0);
  EXPECT_NO_THROW(torch::empty({32 << 20}, torch::kFloat));  // 128 MiB, past the run's budget
}

TEST_F(Oom, AShortLastBatchDoesNotLookLikeAShrunkenMicroBatch) {
  // 280 samples in batches of 64: the last batch of each epoch has 24. Without any OOM the
  // micro-batch setting must stay 64, however eager the grow-back.
  auto tight = std::make_shared<TightUntil>(0);  // never tight; records micro at BatchStart
  const RunResult r =
      run("run", {"dataset.size=280", "training.epochs=3", "+plugins.oom_backoff.grow_after=1"}, {tight});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(tight->micro_at_start.size(), 15u);
  for (auto m : tight->micro_at_start) EXPECT_EQ(m, 64);
}

/// Re-arms the budget before every forward from step 1 on, so that no micro-batch fits;
/// counts ModelToDevice (the initial move and any device fallback).
class AlwaysTight final : public Plugin {
 public:
  std::string name() const override { return "always_tight"; }
  std::vector<Event> events() const override { return {Event::BeforeForward, Event::ModelToDevice}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::ModelToDevice) ++moves;
    if (ctx.state.global_step >= 1) set_memory_limit(kCpu, memory_stats(kCpu).allocated + 1024);
  }
  int moves = 0;
};

TEST_F(Oom, GivesUpCleanlyAtTheMinimumMicroBatch) {
  const RunResult r = run("run", {"+plugins.oom_backoff.min_micro_batch=16"}, {std::make_shared<AlwaysTight>()});
  EXPECT_EQ(r.exit_code, kExitTrainingFailed);
  EXPECT_EQ(r.status, RunStatus::Failed);
  EXPECT_NE(r.message.find("out of memory in forward on cpu after 3 attempt(s) with micro-batches 64 -> 32 -> 16"),
            std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("What to change"), std::string::npos) << r.message;
  EXPECT_NE(r.last_checkpoint.find("step_00000001.pt"), std::string::npos) << r.last_checkpoint;
  EXPECT_NE(read_file(tmp_ / "run/status.json").find("\"status\":\"FAILED\""), std::string::npos);
  // What failed, typed: tools (trainer sweep) read this, not the message's words.
  EXPECT_EQ(r.failure, FailureKind::OutOfMemory);
  EXPECT_EQ(r.oom_phase, OomPhase::Forward);
  EXPECT_EQ(r.oom_micro_batch, 16);  // the last size tried
  const RunStatusRecord s = decode_status(read_file(tmp_ / "run/status.json"));
  EXPECT_EQ(s.failure, FailureKind::OutOfMemory);
  EXPECT_EQ(s.oom_phase, OomPhase::Forward);
  EXPECT_EQ(s.micro_batch, 16);
  EXPECT_EQ(s.message, r.message);
}

TEST_F(Oom, WhenBackingOffIsExhaustedTheRunFallsBackToTheNextDevice) {
  auto always = std::make_shared<AlwaysTight>();
  // "cpu" is skipped (the run is there already); cuda:99 is next, and no host has it.
  const RunResult r =
      run("run",
          {"+plugins.oom_backoff.min_micro_batch=32", "+plugins.oom_backoff.fallback_devices=[\"cpu\", \"cuda:99\"]"},
          {always}, "warn");
  EXPECT_EQ(r.exit_code, kExitTrainingFailed);
  EXPECT_NE(r.message.find("switch_device cuda:99: this process sees "), std::string::npos) << r.message;
  const std::string log = read_file(tmp_ / "run/trainer.log");
  EXPECT_NE(log.find("oom_backoff: cpu exhausted at micro-batch 32, falling back to cuda:99"), std::string::npos)
      << log;
  EXPECT_EQ(always->moves, 1);  // the initial move only
  EXPECT_NE(r.last_checkpoint.find("step_00000001.pt"), std::string::npos) << r.last_checkpoint;  // nothing lost
}

/// Sets a budget nothing fits in before the forward of step 1, and nothing else.
class TightAtStep1 final : public Plugin {
 public:
  std::string name() const override { return "tight_at_step_1"; }
  std::vector<Event> events() const override { return {Event::BeforeForward}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.state.global_step == 1) set_memory_limit(kCpu, memory_stats(kCpu).allocated + 1024);
  }
};

TEST_F(Oom, WithoutAPolicyTheRunFailsAndSaysWhatToLoad) {
  const RunResult r = run("run", {"plugins.load=[\"recording\"]"}, {std::make_shared<TightAtStep1>()});
  EXPECT_EQ(r.exit_code, kExitTrainingFailed);
  EXPECT_NE(r.message.find("no plugin asked for another retry; oom_backoff retries down to its min_micro_batch"),
            std::string::npos)
      << r.message;
}

TEST_F(Oom, EvalOomRetriesWithoutDoubleCounting) {
  fix_threads();
  // The second batch of the first evaluation runs out of memory for real.
  testing::RefusingData::add("flaky_eval", "synthetic", Split::Test, 2, 1024, 4 << 20);
  const std::vector<std::string> eval = {"eval.every_epochs=1", "eval.batch_size=24"};
  ASSERT_EQ(run("clean", eval).exit_code, kExitOk);
  const auto clean = read_file(tmp_ / "clean/events.jsonl");
  auto with = eval;
  with.push_back("dataset.name=flaky_eval");
  const RunResult r = run("oom", with);
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  const auto metric = [](const std::string& events, const std::string& key) {
    for (const auto& line : testing::read_lines_of(events)) {
      if (testing::json_str(line, "event") == "EvalEnd") return *testing::json_num(line, key);
    }
    return -1.0;
  };
  EXPECT_EQ(metric(read_file(tmp_ / "oom/events.jsonl"), "eval/accuracy"), metric(clean, "eval/accuracy"));
  // The retry's batches of 12 sum the float32 losses in another order than batches of 24 (~1e-7
  // relative); a sample lost or counted twice moves the mean by ~1e-2.
  const double clean_loss = metric(clean, "eval/loss");
  EXPECT_NEAR(metric(read_file(tmp_ / "oom/events.jsonl"), "eval/loss"), clean_loss,
              1e-6 * std::max(1.0, std::fabs(clean_loss)));
}

}  // namespace
}  // namespace trainer
