// What a failing or repeated run must not lose or corrupt: parameters torn by a failure
// inside the optimizer step are never checkpointed, a resumed run that is already done trains
// nothing, an interrupt of an earlier run does not stop the next.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <filesystem>
#include <new>

#include "support/test_util.h"
#include "trainer/memory.h"
#include "trainer/optim.h"
#include "trainer/settings.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::metric_by_step;
using testing::read_file;

namespace fs = std::filesystem;

/// [optim] of "torn_sgd": SGD whose step number `fail_at` updates the first parameter and
/// then fails, as an optimizer failing half-way through its parameters would.
struct TornSettings : Settings<TornSettings> {
  double lr = 0.1;
  std::int64_t fail_at = 0;
  std::string failure = "error";

  static void declare(SettingsSchema<TornSettings>& s) {
    s.add(&TornSettings::lr, "lr", "Learning rate");
    s.add(&TornSettings::fail_at, "fail_at", "The step (1-based) that fails");
    s.add(&TornSettings::failure, "failure", "What it throws").choices({"error", "bad_alloc", "oom"});
  }
};

class TornSgd final : public torch::optim::SGD {
 public:
  TornSgd(std::vector<at::Tensor> params, const TornSettings& s)
      : SGD(std::move(params), torch::optim::SGDOptions(s.lr)), s_(s) {}

  at::Tensor step(LossClosure closure = nullptr) override {
    if (++calls_ != s_.fail_at) return SGD::step(std::move(closure));
    {
      at::NoGradGuard no_grad;
      param_groups().front().params().front().add_(1.0);
    }
    if (s_.failure == "bad_alloc") throw std::bad_alloc();
    // A real allocation past the run's memory budget: the allocator raises OutOfMemoryError.
    if (s_.failure == "oom") at::empty({std::int64_t{1} << 32}, at::kByte);
    throw std::runtime_error("torn_sgd failed half-way");
  }

 private:
  TornSettings s_;
  std::int64_t calls_ = 0;
};

class Reliability : public testing::TrainerTest {
 protected:
  void SetUp() override {
    TrainerTest::SetUp();
    optimizer_registry().add(
        "torn_sgd",
        [](const Config& c, std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
          return std::make_unique<TornSgd>(std::move(params), TornSettings::from(c));
        },
        TornSettings::keys(), "SGD that fails half-way through a step");
  }

  RunResult run(const std::vector<std::string>& overrides, const std::string& name = "run",
                const std::string& resume = "") {
    TrainerOptions o = options_for(recipe_, overrides, name);
    o.resume = resume;
    Trainer t(std::move(o));
    return t.fit();
  }

  std::vector<std::string> checkpoint_files(const std::string& name) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(tmp_ / (name + "/checkpoints")))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string recipe_ = testing::kSmallRun;
};

TEST_F(Reliability, AFailureInsideTheOptimizerStepIsNeverCheckpointed) {
  // Step 4 fails after updating one parameter; step 2 was checkpointed. Without the guard the
  // failure path writes step_00000003.pt from the torn parameters and points latest at it.
  for (const std::string failure : {"error", "bad_alloc", "oom"}) {
    SCOPED_TRACE(failure);
    const RunResult r = run({"optim.name=\"torn_sgd\"", "+optim.fail_at=4", "+optim.failure=\"" + failure + "\"",
                             "checkpoint.every_epochs=0", "+checkpoint.every_steps=2", "+memory.limit_mb=1024"},
                            failure);
    EXPECT_EQ(r.exit_code, kExitTrainingFailed);
    EXPECT_EQ(r.status, RunStatus::Failed);
    EXPECT_EQ(r.global_step, 3);
    const char* expected = failure == "error"       ? "torn_sgd failed half-way"
                           : failure == "bad_alloc" ? "bad_alloc"
                                                    : "out of memory inside the optimizer step";
    EXPECT_NE(r.message.find(expected), std::string::npos) << r.message;
    EXPECT_EQ(checkpoint_files(failure),
              (std::vector<std::string>{"latest", "step_00000002.pt", "step_00000002.pt.sum"}));
    EXPECT_EQ(read_file(tmp_ / (failure + "/checkpoints/latest")), "step_00000002.pt\n");
    EXPECT_NE(r.last_checkpoint.find("step_00000002.pt"), std::string::npos) << r.last_checkpoint;
    EXPECT_NE(read_file(tmp_ / (failure + "/trainer.log")).find("no final checkpoint"), std::string::npos);
  }
}

TEST_F(Reliability, ARunResumedAtMaxStepsTrainsNoMoreSteps) {
  ASSERT_EQ(run({"training.max_steps=3"}, "first").global_step, 3);
  // Resumed twice, as an automatic requeue would: neither run takes a step.
  const RunResult again = run({"training.max_steps=3"}, "again", tmp_ / "first");
  ASSERT_EQ(again.exit_code, kExitOk) << again.message;
  EXPECT_EQ(again.global_step, 3);
  EXPECT_TRUE(metric_by_step(tmp_ / "again/metrics.jsonl", "train/loss").empty());
  const RunResult third = run({"training.max_steps=3"}, "third", tmp_ / "again");
  ASSERT_EQ(third.exit_code, kExitOk) << third.message;
  EXPECT_EQ(third.global_step, 3);
  EXPECT_NE(third.last_checkpoint.find("step_00000003.pt"), std::string::npos) << third.last_checkpoint;
}

TEST_F(Reliability, AnInterruptLeftByAnEarlierRunDoesNotStopTheNext) {
  request_interrupt();  // as a signal during an earlier Trainer in this process would
  const RunResult r = run({});
  clear_interrupt();
  EXPECT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 4);
}

/// A metric sink whose close() throws something that is not a std::exception.
class HostileSink final : public MetricSink {
 public:
  void write(const std::vector<MetricPoint>&) override {}
  void close(const std::string&) override { throw 42; }
};

/// Adds a HostileSink at Init and throws an int in Shutdown and Exception; `in_configure`
/// throws an int from configure() instead.
class Hostile final : public Plugin {
 public:
  explicit Hostile(bool in_configure = false) : in_configure_(in_configure) {}
  std::string name() const override { return "hostile"; }
  std::vector<Event> events() const override { return {Event::Init, Event::Shutdown, Event::Exception}; }
  FailurePolicy default_policy() const override { return FailurePolicy::Essential; }
  void configure(const Config& section, std::shared_ptr<spdlog::logger> logger) override {
    if (in_configure_) throw 42;
    Plugin::configure(section, std::move(logger));
  }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::Init) {
      ctx.metrics->add_sink(std::make_shared<HostileSink>());
      return;
    }
    throw 7;
  }

 private:
  bool in_configure_;
};

TEST_F(Reliability, FitNeverThrowsWhateverThePluginsThrowAtTheEnd) {
  TrainerOptions o = options_for(recipe_, {}, "run", {std::make_shared<Hostile>()});
  Trainer t(std::move(o));
  RunResult r;
  ASSERT_NO_THROW(r = t.fit());
  EXPECT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 4);
  const std::string log = read_file(tmp_ / "run/trainer.log");
  EXPECT_NE(log.find("Shutdown: plugin 'hostile' failed in Shutdown: unknown exception"), std::string::npos) << log;
  EXPECT_NE(log.find("failed to close: an exception that is not a std::exception"), std::string::npos) << log;
  EXPECT_NE(read_file(tmp_ / "run/status.json").find("\"status\":\"FINISHED\""), std::string::npos);
}

TEST_F(Reliability, APluginThrowingANonStandardExceptionInConfigureFailsTheRunNamingIt) {
  TrainerOptions o = options_for(recipe_, {}, "run", {std::make_shared<Hostile>(true)});
  Trainer t(std::move(o));
  RunResult r;
  ASSERT_NO_THROW(r = t.fit());
  EXPECT_EQ(r.exit_code, kExitTrainingFailed);
  EXPECT_NE(r.message.find("plugin 'hostile' failed in configure: an exception that is not a std::exception"),
            std::string::npos)
      << r.message;
  EXPECT_NE(read_file(tmp_ / "run/status.json").find("\"status\":\"FAILED\""), std::string::npos);
}

/// From the first optimizer step on, leaves too little memory for AdamW's state (two tensors
/// per parameter) but enough for the forward and backward passes, and records each OOM.
class StarveTheOptimizerStep final : public Plugin {
 public:
  std::string name() const override { return "starve_step"; }
  std::vector<Event> events() const override { return {Event::BeforeOptimizerStep, Event::OutOfMemory}; }
  void on_event(EventContext& ctx, Control&) override {
    const c10::Device cpu(c10::kCPU);
    if (ctx.event == Event::OutOfMemory) {
      ooms.emplace_back(oom_phase_name(ctx.oom->phase), ctx.oom->micro_batch_size);
      helps.push_back(ctx.oom->micro_batch_helps);
      return;
    }
    if (set_) return;
    set_ = true;
    std::int64_t largest = 0;
    for (const auto& p : ctx.model->parameters()) largest = std::max<std::int64_t>(largest, p.nbytes());
    set_memory_limit(cpu, memory_stats(cpu).allocated + largest * 3 / 2);
  }
  std::vector<std::pair<std::string, std::int64_t>> ooms;
  std::vector<bool> helps;

 private:
  bool set_ = false;
};

TEST_F(Reliability, AnOptimizerStepThatCannotFitIsNotBackedOffThroughEveryMicroBatch) {
  auto starve = std::make_shared<StarveTheOptimizerStep>();
  TrainerOptions o = options_for(recipe_,
                                 {"plugins.load=[\"oom_backoff\"]", "model.hidden=[2048]", "training.batch_size=16",
                                  "optim.name=adamw", "optim.lr=0.001"},
                                 "run", {starve});
  Trainer t(std::move(o));
  const RunResult r = t.fit();
  set_memory_limit(c10::Device(c10::kCPU), 0);
  EXPECT_EQ(r.exit_code, kExitTrainingFailed) << r.message;
  // One retry at the same size after the cache was freed, then the run stops: no walk down
  // 16 -> 8 -> 4 -> 2 -> 1, and no advice to shrink the micro-batch.
  using Oom = std::pair<std::string, std::int64_t>;
  EXPECT_EQ(starve->ooms, (std::vector<Oom>{{"optimizer_step", 16}, {"optimizer_step", 16}}));
  EXPECT_EQ(starve->helps, (std::vector<bool>{false, false}));
  EXPECT_NE(r.message.find("out of memory in optimizer_step"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("do not depend on the micro-batch"), std::string::npos) << r.message;
  EXPECT_EQ(r.message.find("a smaller training.micro_batch_size"), std::string::npos) << r.message;
}

TEST_F(Reliability, ExtremeCountsNeitherOverflowNorCrash) {
  // A batch as large as an int64 holds: one batch of all 64 samples per epoch.
  RunResult r = run({"training.batch_size=9223372036854775807", "eval.batch_size=9223372036854775807"}, "huge_batch");
  EXPECT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 2);
  // 2^62 epochs of 2 steps: the step count the schedule plans for would overflow.
  r = run({"training.epochs=4611686018427387904"}, "many_epochs");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("training.epochs = 4611686018427387904 times 2 steps per epoch"), std::string::npos)
      << r.message;
}

TEST_F(Reliability, ATrainerRunsOnceAndATrailingSlashDoesNotDoubleInPaths) {
  TrainerOptions o = options_for(recipe_, {"training.epochs=1"}, "run/");
  Trainer t(std::move(o));
  const RunResult r = t.fit();
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.run_dir, tmp_ / "run");
  EXPECT_EQ(r.last_checkpoint, tmp_ / "run/checkpoints/step_00000002.pt");
  const RunResult again = t.fit();  // the run's state is spent: refused, not undefined
  EXPECT_EQ(again.exit_code, kExitUsage);
  EXPECT_NE(again.message.find("already called"), std::string::npos) << again.message;
}

}  // namespace
}  // namespace trainer
