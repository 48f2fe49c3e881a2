// The memory ladder (oom_backoff's rungs) end to end on the CPU: every out-of-memory error here
// is a real allocation refused under memory.limit_mb (or under the same budget with a tensor a
// test plugin holds), recovered by the core and the real oom_backoff .so. Budgets are set from
// peaks measured in the same test (bytes are deterministic), so they hold on every CPU.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>

#include "support/test_util.h"
#include "support/tiny_text.h"
#include "trainer/memory.h"
#include "trainer/run_records.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::metric_by_step;
using testing::read_file;

const c10::Device kCpu(c10::kCPU);

// A ViT whose blocks' activations are a fifth of a step's peak even at a micro-batch of 1: six
// encoder layers (blocks) over 50 tokens (4x4 patches of 28x28). SGD and no dropout: a run split into other
// micro-batches ends at the same parameters up to float32 rounding of the gradients' sums (the back-off tests' rule).
constexpr const char* kVitRecipe = R"(
[run]
seed = 3
[model]
name = "vit"
patch_size = 4
hidden_dim = 96
num_layers = 6
num_heads = 4
mlp_dim = 192
dropout = 0.0
attention_dropout = 0.0
[dataset]
name = "synthetic"
size = 32
eval_size = 8
shape = [1, 28, 28]
[training]
epochs = 1
batch_size = 8
micro_batch_size = 8
log_every = 1
[optim]
name = "sgd"
lr = 0.05
[eval]
every_epochs = 0
at_end = false
[checkpoint]
every_epochs = 0
at_end = false
[metrics]
console = false
[plugins]
load = ["oom_backoff"]
)";

// A wide MLP with AdamW whose optimizer state (two fp32 moments of 1.3 M parameters) and step
// outweigh everything else: its first out-of-memory error is in the optimizer step.
constexpr const char* kMlpRecipe = R"(
[run]
seed = 4
[model]
name = "mlp"
hidden = [1024, 1024]
[dataset]
name = "synthetic"
size = 64
eval_size = 8
shape = [1, 16, 16]
[training]
epochs = 1
batch_size = 16
log_every = 1
[optim]
name = "adamw"
lr = 0.001
[eval]
every_epochs = 0
at_end = false
[metrics]
console = false
[plugins]
load = ["oom_backoff"]
)";

// A BERT-style text encoder (4 layers of width 128, 4 heads) on tiny_text.h's texts, every batch
// padded to 64 tokens (no columns of padding cut): its blocks' activations, like the ViT's, are a
// large part of a step at a micro-batch of 1. SGD and no dropout, as the ViT.
std::string bert_recipe(const std::string& dir) {
  testing::tiny_text_recipe(dir);  // the tokenizer and the texts
  return "[run]\nseed = 5\n"
         "[model]\nname = \"bert\"\nhidden_size = 128\nnum_hidden_layers = 4\nnum_attention_heads = 4\n"
         "intermediate_size = 256\nmax_position_embeddings = 64\nhidden_dropout_prob = 0.0\n"
         "attention_probs_dropout_prob = 0.0\ntrim_padding = false\n"
         "[dataset]\nname = \"text\"\ntrain = \"" +
         dir + "/train.csv\"\ntest = \"" + dir + "/test.csv\"\ntokenizer = \"" + dir +
         "/tokenizer.json\"\nmax_length = 64\npadding = \"max_length\"\n"
         "[training]\nepochs = 1\nbatch_size = 8\nmicro_batch_size = 8\nmax_steps = 4\nlog_every = 1\n"
         "[optim]\nname = \"sgd\"\nlr = 0.05\n"
         "[eval]\nevery_epochs = 0\nat_end = false\n[checkpoint]\nevery_epochs = 0\nat_end = false\n"
         "[metrics]\nconsole = false\n[plugins]\nload = [\"oom_backoff\"]\n";
}

/// The highest peak of allocated CPU memory over the training batches (BatchStart to BatchEnd;
/// writing a checkpoint serializes a copy of the model, which is not a step's), and the memory
/// savers on after each step.
class Probe final : public Plugin {
 public:
  std::string name() const override { return "probe"; }
  std::vector<Event> events() const override { return {Event::BatchStart, Event::BatchEnd}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::BatchStart) reset_peak_memory(kCpu);
    if (ctx.event == Event::BatchStart && first_blocks < 0) {
      first_blocks = ctx.state.checkpointed_blocks;
      first_bits = ctx.state.optimizer_moment_bits;
      first_offload = ctx.state.optimizer_offload;
    }
    if (ctx.event == Event::BatchEnd) {
      peak = std::max(peak, memory_stats(kCpu).peak_allocated);
      blocks.push_back(ctx.state.checkpointed_blocks);
      bits.push_back(ctx.state.optimizer_moment_bits);
      offload.push_back(ctx.state.optimizer_offload);
      micro.push_back(ctx.state.micro_batch_size);
    }
  }
  std::int64_t peak = 0;
  std::int64_t first_blocks = -1;
  int first_bits = -1;
  bool first_offload = false;
  std::vector<std::int64_t> blocks, micro;
  std::vector<int> bits;
  std::vector<bool> offload;
};

/// Asks the core to checkpoint every block from the first batch on (Control::checkpointed_blocks).
class AllBlocks final : public Plugin {
 public:
  std::string name() const override { return "all_blocks"; }
  std::vector<Event> events() const override { return {Event::BatchStart}; }
  void on_event(EventContext&, Control& c) override { c.checkpointed_blocks = 1000; }
};

/// Asks the core to keep AdamW's moments in host memory (Control::optimizer_offload) at the
/// batch of step `on`, and on the device again at the batch of step `off` (-1: never).
class OffloadAt final : public Plugin {
 public:
  OffloadAt(std::int64_t on, std::int64_t off) : on_(on), off_(off) {}
  std::string name() const override { return "offload_at"; }
  std::vector<Event> events() const override { return {Event::BatchStart}; }
  void on_event(EventContext& ctx, Control& c) override {
    if (ctx.state.global_step == on_) c.optimizer_offload = true;
    if (ctx.state.global_step == off_) c.optimizer_offload = false;
  }

 private:
  std::int64_t on_, off_;
};

/// Lifts the budget after the batch of step `last` (before the run's final checkpoint, whose
/// serialized copy of the model a budget set for the steps does not hold).
class LiftAfter final : public Plugin {
 public:
  explicit LiftAfter(std::int64_t last) : last_(last) {}
  std::string name() const override { return "lift_after"; }
  std::vector<Event> events() const override { return {Event::BatchEnd}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.state.global_step >= last_) set_memory_limit(kCpu, 0);
  }

 private:
  std::int64_t last_;
};

/// Holds `bytes` of CPU memory from FitStart until the batch of step `until` starts.
class Hog final : public Plugin {
 public:
  Hog(std::int64_t bytes, std::int64_t until) : bytes_(bytes), until_(until) {}
  std::string name() const override { return "hog"; }
  std::vector<Event> events() const override { return {Event::FitStart, Event::BatchStart}; }
  int default_priority() const override { return -10; }  // before oom_backoff
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::FitStart) held_ = torch::ones({bytes_}, torch::kByte);
    if (ctx.event == Event::BatchStart && ctx.state.global_step >= until_) held_ = at::Tensor();
  }

 private:
  std::int64_t bytes_, until_;
  at::Tensor held_;
};

std::string limit_mb(std::int64_t bytes) { return fmt::format("+memory.limit_mb={:.6f}", double(bytes) / (1 << 20)); }

class MemoryLadder : public testing::TrainerTest {
 protected:
  void SetUp() override {
    testing::TrainerTest::SetUp();
    install_cpu_tracking_allocator();
  }
  void TearDown() override { set_memory_limit(kCpu, 0); }

  RunResult run(const std::string& recipe, const std::vector<std::string>& overrides, const std::string& name,
                std::vector<std::shared_ptr<Plugin>> extra = {}, const std::string& resume = "") {
    params.clear();  // each run starts from the same memory held by the test
    TrainerOptions o = options_for(recipe, overrides, name, extra);
    o.log_level = "info";
    o.resume = resume;
    Trainer t(std::move(o));
    RunResult r = t.fit();
    if (t.model()) {
      for (const auto& p : t.model()->parameters()) params.push_back(p.detach().clone());
    }
    return r;
  }
  static void expect_params_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6))
          << "param " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>();
    }
  }
  RunStatusRecord status(const std::string& name) { return decode_status(read_file(tmp_ / (name + "/status.json"))); }
  std::string log(const std::string& name) { return read_file(tmp_ / (name + "/trainer.log")); }

  /// The ViT's unbudgeted run (its parameters into `reference`, held from then on: every later
  /// run starts from the same memory), then a budget halfway between the peaks of one sample per
  /// micro-batch plain and with every block checkpointed.
  std::int64_t vit_budget_between_one_sample_plain_and_checkpointed(std::vector<at::Tensor>& reference) {
    return budget_between_one_sample_plain_and_checkpointed(kVitRecipe, 6, reference);
  }
  /// The same for `recipe`, a model of `blocks` blocks.
  std::int64_t budget_between_one_sample_plain_and_checkpointed(const std::string& recipe, std::int64_t blocks,
                                                                std::vector<at::Tensor>& reference) {
    if (run(recipe, {}, "reference").exit_code != kExitOk) return 0;
    reference = params;
    auto plain = std::make_shared<Probe>(), checkpointed = std::make_shared<Probe>();
    if (run(recipe, {"training.micro_batch_size=1"}, "plain1", {plain}).exit_code != kExitOk) return 0;
    if (run(recipe, {"training.micro_batch_size=1"}, "ckpt1", {checkpointed, std::make_shared<AllBlocks>()})
            .exit_code != kExitOk) {
      return 0;
    }
    EXPECT_EQ(checkpointed->blocks.back(), blocks);
    EXPECT_LT(checkpointed->peak + (256 << 10), plain->peak) << "checkpointing saves too little to test the ladder";
    return (plain->peak + checkpointed->peak) / 2;
  }

  std::vector<at::Tensor> params;
};

TEST_F(MemoryLadder, AViTThatCannotStepAtMicroBatch1FinishesWithExactRungsAndTheUnbudgetedParameters) {
  fix_threads();
  std::vector<at::Tensor> reference;
  const std::int64_t budget = vit_budget_between_one_sample_plain_and_checkpointed(reference);
  ASSERT_GT(budget, 0);

  // Without the ladder's other rungs the budget is too small even for one sample at a time.
  const RunResult alone = run(kVitRecipe, {limit_mb(budget), "+plugins.oom_backoff.ladder=[\"micro_batch\"]"}, "alone");
  ASSERT_EQ(alone.exit_code, kExitTrainingFailed) << alone.message;
  EXPECT_EQ(alone.failure, FailureKind::OutOfMemory);
  EXPECT_EQ(alone.oom_micro_batch, 1);

  // With the ladder ("auto"): checkpointing first (a micro-batch of 8 is small), then smaller
  // micro-batches; every rung exact, so the parameters are the unbudgeted run's.
  auto probe = std::make_shared<Probe>();
  const RunResult r = run(kVitRecipe, {limit_mb(budget)}, "ladder", {probe});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 4);
  expect_params_close(params, reference);
  EXPECT_GT(probe->blocks.back(), 0);
  EXPECT_LT(probe->micro.back(), 8);
  EXPECT_EQ(probe->bits, std::vector<int>(4, 0));  // SGD: no moments to change, nothing inexact
  const std::string text = log("ladder");
  EXPECT_NE(text.find("oom_backoff: rung checkpoint: out of memory in "), std::string::npos) << text;
  // On the CPU "auto" halves the micro-batch down to 2, then checkpoints a quarter of the blocks.
  EXPECT_NE(text.find("checkpointing 2 of 6 blocks at micro-batch 2 (exact)"), std::string::npos) << text;
  EXPECT_NE(text.find("oom_backoff: rung micro_batch: "), std::string::npos) << text;
  EXPECT_NE(text.find("activation checkpointing: 0 -> 2 of 6 blocks checkpointed"), std::string::npos) << text;
  EXPECT_EQ(text.find("rung optimizer_"), std::string::npos) << text;
  const RunStatusRecord s = status("ladder");
  EXPECT_EQ(s.status, RunStatus::Finished);
  EXPECT_EQ(s.checkpointed_blocks, probe->blocks.back());
  EXPECT_EQ(s.optimizer_moment_bits, 0);
  const auto rung = metric_by_step(tmp_ / "ladder/metrics.jsonl", "memory/rung");
  ASSERT_FALSE(rung.empty());
  EXPECT_EQ(rung.begin()->second, 2.0);  // checkpointing (rung 2) on from the first step
  EXPECT_FALSE(metric_by_step(tmp_ / "ladder/metrics.jsonl", "memory/checkpointed_blocks").empty());
}

// The same for a text encoder: its layers are the blocks the checkpoint rung takes.
TEST_F(MemoryLadder, ATextEncoderThatCannotStepAtMicroBatch1FinishesWithExactRungsAndTheUnbudgetedParameters) {
  fix_threads();
  const std::string recipe = bert_recipe(tmp_ / "text");
  std::vector<at::Tensor> reference;
  const std::int64_t budget = budget_between_one_sample_plain_and_checkpointed(recipe, 4, reference);
  ASSERT_GT(budget, 0);
  const RunResult alone = run(recipe, {limit_mb(budget), "+plugins.oom_backoff.ladder=[\"micro_batch\"]"}, "alone");
  ASSERT_EQ(alone.exit_code, kExitTrainingFailed) << alone.message;
  EXPECT_EQ(alone.failure, FailureKind::OutOfMemory);
  EXPECT_EQ(alone.oom_micro_batch, 1);
  auto probe = std::make_shared<Probe>();
  const RunResult r = run(recipe, {limit_mb(budget)}, "ladder", {probe});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 4);
  expect_params_close(params, reference);
  EXPECT_GT(probe->blocks.back(), 0);
  const std::string text = log("ladder");
  EXPECT_NE(text.find("oom_backoff: rung checkpoint: out of memory in "), std::string::npos) << text;
  EXPECT_NE(text.find(" of 4 blocks checkpointed"), std::string::npos) << text;
  EXPECT_EQ(status("ladder").checkpointed_blocks, probe->blocks.back());
}

TEST_F(MemoryLadder, AResumeStartsWithTheRungsOnAndEndsAtTheStraightRunsParameters) {
  fix_threads();
  std::vector<at::Tensor> reference;
  const std::int64_t budget = vit_budget_between_one_sample_plain_and_checkpointed(reference);
  ASSERT_GT(budget, 0);
  const RunResult part = run(kVitRecipe, {limit_mb(budget), "training.max_steps=2", "checkpoint.at_end=true"}, "part",
                             {std::make_shared<LiftAfter>(2)});
  ASSERT_EQ(part.exit_code, kExitOk) << part.message;
  const std::int64_t on = status("part").checkpointed_blocks;
  EXPECT_GT(on, 0);
  // Resumed without the budget: the blocks are checkpointed from its first batch (then, after
  // grow_after clean steps, no longer: the default 50 is not reached here).
  auto probe = std::make_shared<Probe>();
  const RunResult r = run(kVitRecipe, {}, "resumed", {probe}, tmp_ / "part");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(probe->first_blocks, on);
  EXPECT_EQ(probe->blocks, (std::vector<std::int64_t>{on, on}));
  EXPECT_LT(probe->micro.front(), 8);  // oom_backoff's micro-batch, from its plugin state
  EXPECT_EQ(r.global_step, 4);
  expect_params_close(params, reference);
  EXPECT_NE(log("resumed").find("activation checkpointing: 0 -> " + std::to_string(on) +
                                " of 6 blocks checkpointed (the first in forward order) (as when the checkpoint was "
                                "written)"),
            std::string::npos);
}

TEST_F(MemoryLadder, AnOptimizerStepOutOfMemoryTakesBf16MomentsOnlyWithAllowInexact) {
  auto full = std::make_shared<Probe>();
  ASSERT_EQ(run(kMlpRecipe, {}, "adamw", {full}).exit_code, kExitOk);
  const std::int64_t params_count = 256 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10;
  const std::int64_t state = 2 * 4 * params_count;  // AdamW's two fp32 moments
  // A quarter of the state less than the run needed: bf16 moments (half of it) fit, fp32 ones not.
  const std::int64_t budget = full->peak - state / 4;

  const RunResult refused = run(kMlpRecipe, {limit_mb(budget)}, "refused");
  ASSERT_EQ(refused.exit_code, kExitTrainingFailed) << refused.message;
  EXPECT_EQ(refused.oom_phase, OomPhase::OptimizerStep);
  EXPECT_NE(refused.message.find("plugins.oom_backoff.allow_inexact = true"), std::string::npos) << refused.message;
  EXPECT_NE(refused.message.find("optim.name = \"adamw8bit\""), std::string::npos) << refused.message;

  auto probe = std::make_shared<Probe>();
  const RunResult r =
      run(kMlpRecipe, {limit_mb(budget), "+plugins.oom_backoff.allow_inexact=true"}, "inexact", {probe});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 4);
  EXPECT_EQ(probe->bits, std::vector<int>(4, 16));
  EXPECT_EQ(probe->blocks, std::vector<std::int64_t>(4, 0));  // an MLP has no blocks
  const std::string text = log("inexact");
  EXPECT_NE(text.find("oom_backoff: rung optimizer_bf16: out of memory in optimizer_step"), std::string::npos) << text;
  EXPECT_NE(text.find("optimizer moments: 32 -> 16 bits"), std::string::npos) << text;
  EXPECT_NE(text.find("(not exact: the moments lose precision)"), std::string::npos) << text;
  EXPECT_EQ(status("inexact").optimizer_moment_bits, 16);
  const auto loss = metric_by_step(tmp_ / "inexact/metrics.jsonl", "train/loss");
  ASSERT_EQ(loss.size(), 4u);
  for (const auto& [step, value] : loss) EXPECT_TRUE(std::isfinite(value)) << step;

  // A resume converts its optimizer to the checkpoint's bits before reading its state.
  auto resumed = std::make_shared<Probe>();
  const RunResult again = run(kMlpRecipe, {"training.epochs=2"}, "resumed", {resumed}, tmp_ / "inexact");
  ASSERT_EQ(again.exit_code, kExitOk) << again.message;
  EXPECT_EQ(resumed->first_bits, 16);
  EXPECT_EQ(again.global_step, 8);
}

TEST_F(MemoryLadder, MemoryFreedWalksTheRungsBackDown) {
  fix_threads();
  // The ViT at micro-batch 8 under a budget it just fits, while a plugin holds half of what
  // checkpointing every block saves: blocks get checkpointed (ladder = ["checkpoint",
  // "micro_batch"]: checkpointing before a smaller micro-batch); once the memory is freed (step
  // 2), one rung comes off after each clean step (grow_after = 1) down to none.
  ASSERT_EQ(run(kVitRecipe, {"dataset.size=96"}, "reference").exit_code, kExitOk);
  const std::vector<at::Tensor> reference = params;  // held from here on: the same memory for every run below
  auto plain = std::make_shared<Probe>(), checkpointed = std::make_shared<Probe>();
  ASSERT_EQ(run(kVitRecipe, {"dataset.size=96"}, "plain8", {plain}).exit_code, kExitOk);
  ASSERT_EQ(run(kVitRecipe, {"dataset.size=96"}, "ckpt8", {checkpointed, std::make_shared<AllBlocks>()}).exit_code,
            kExitOk);
  const std::int64_t hog = (plain->peak - checkpointed->peak) / 2;
  ASSERT_GT(hog, 256 << 10);
  auto probe = std::make_shared<Probe>();
  const RunResult r = run(kVitRecipe,
                          {"dataset.size=96", limit_mb(plain->peak + (64 << 10)), "+plugins.oom_backoff.grow_after=1",
                           "+plugins.oom_backoff.ladder=[\"checkpoint\", \"micro_batch\"]"},
                          "walk", {probe, std::make_shared<Hog>(hog, 2)});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(probe->blocks.size(), 12u);
  EXPECT_GT(probe->blocks.front(), 0);
  EXPECT_EQ(probe->blocks.back(), 0);
  EXPECT_TRUE(std::is_sorted(probe->blocks.begin() + 1, probe->blocks.end(), std::greater<>()))
      << ::testing::PrintToString(probe->blocks);  // down once the memory is free, never up again
  EXPECT_EQ(probe->micro.back(), 8);
  expect_params_close(params, reference);
  EXPECT_EQ(status("walk").checkpointed_blocks, 0);
  EXPECT_NE(log("walk").find("clean steps, checkpointing "), std::string::npos);
  const auto rung = metric_by_step(tmp_ / "walk/metrics.jsonl", "memory/rung");
  ASSERT_FALSE(rung.empty());
  EXPECT_EQ(rung.rbegin()->second, 0.0);

  // The MLP's AdamW moments: 16 bits while the memory is held, 32 again after.
  auto full = std::make_shared<Probe>();
  ASSERT_EQ(run(kMlpRecipe, {"dataset.size=160"}, "adamw", {full}).exit_code, kExitOk);
  const std::int64_t state = 2 * 4 * (256 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10);
  auto moments = std::make_shared<Probe>();
  const RunResult m = run(kMlpRecipe,
                          {"dataset.size=160", limit_mb(full->peak + (64 << 10)), "+plugins.oom_backoff.grow_after=1",
                           "+plugins.oom_backoff.allow_inexact=true"},
                          "moments", {moments, std::make_shared<Hog>(state / 4, 2)});
  ASSERT_EQ(m.exit_code, kExitOk) << m.message;
  ASSERT_EQ(moments->bits.size(), 10u);
  EXPECT_EQ(moments->bits.front(), 16);
  EXPECT_EQ(moments->bits.back(), 32);
  EXPECT_EQ(status("moments").optimizer_moment_bits, 0);  // as optim.name gives: not listed
  EXPECT_NE(log("moments").find("clean steps, AdamW's moments back to 32 bits"), std::string::npos);
}

TEST_F(MemoryLadder, MomentsOffloadedToHostMemoryTrainOnAsOnTheDeviceAndAResumeKeepsThemThere) {
  fix_threads();
  // The offload rung's core half, on the CPU: the moments' memory is the host's here, so
  // nothing moves, but the step streams them a chunk at a time through copies as on a GPU, and
  // the switch, its log, metric, status and checkpoint are those of a GPU run. (oom_backoff
  // takes the rung only on a GPU; tests/gpu/cuda_test.cpp runs it there.) The tolerance is the
  // back-off tests' rule: the streamed step runs AdamW's element-wise operations on chunks of
  // 65,536 values instead of the 1 M-value weight whole, and a kernel may take its scalar
  // instead of its vector path for other elements then.
  ASSERT_EQ(run(kMlpRecipe, {}, "reference").exit_code, kExitOk);
  const std::vector<at::Tensor> reference = params;
  auto probe = std::make_shared<Probe>();
  const RunResult r = run(kMlpRecipe, {}, "there_and_back", {probe, std::make_shared<OffloadAt>(1, 3)});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(probe->offload, (std::vector<bool>{false, true, true, false}));
  expect_params_close(params, reference);
  const std::string text = log("there_and_back");
  EXPECT_NE(text.find("optimizer moments: offloaded to host memory, streamed through each step, optimizer state on "
                      "cpu"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("optimizer moments: back on the device"), std::string::npos) << text;
  const auto metric = metric_by_step(tmp_ / "there_and_back/metrics.jsonl", "memory/optimizer_offload");
  EXPECT_EQ(metric, (std::map<long, double>{{1, 1.0}, {3, 0.0}}));
  EXPECT_FALSE(status("there_and_back").optimizer_offload);

  // Stopped while offloaded: the status and the checkpoint say so; the resumed run reads its
  // optimizer state into host memory before its first batch, and ends as the straight run.
  const RunResult part =
      run(kMlpRecipe, {"training.max_steps=2", "checkpoint.at_end=true"}, "part", {std::make_shared<OffloadAt>(1, -1)});
  ASSERT_EQ(part.exit_code, kExitOk) << part.message;
  EXPECT_TRUE(status("part").optimizer_offload);
  EXPECT_NE(read_file(tmp_ / "part/status.json").find("\"optimizer_offload\":true"), std::string::npos);
  auto resumed = std::make_shared<Probe>();
  const RunResult again = run(kMlpRecipe, {}, "resumed", {resumed}, tmp_ / "part");
  ASSERT_EQ(again.exit_code, kExitOk) << again.message;
  EXPECT_TRUE(resumed->first_offload);
  EXPECT_EQ(resumed->offload, (std::vector<bool>{true, true}));
  EXPECT_EQ(again.global_step, 4);
  expect_params_close(params, reference);
  EXPECT_NE(log("resumed").find("(as when the checkpoint was written)"), std::string::npos);

  // oom_backoff climbs down from it first, after grow_after clean steps (here its rung would
  // not be taken: on the CPU it is skipped).
  auto down = std::make_shared<Probe>();
  const RunResult walked =
      run(kMlpRecipe, {"+plugins.oom_backoff.grow_after=1"}, "down", {down, std::make_shared<OffloadAt>(0, -1)});
  ASSERT_EQ(walked.exit_code, kExitOk) << walked.message;
  EXPECT_EQ(down->offload.front(), true);
  EXPECT_EQ(down->offload.back(), false);
  EXPECT_NE(log("down").find("clean steps, AdamW's moments back on the device"), std::string::npos) << log("down");

  // An optimizer whose moments cannot move: a warning, nothing else.
  const RunResult sgd = run(kMlpRecipe, {"optim.name=\"sgd\""}, "sgd", {std::make_shared<OffloadAt>(1, -1)});
  ASSERT_EQ(sgd.exit_code, kExitOk) << sgd.message;
  EXPECT_NE(log("sgd").find("optimizer_offload true ignored: only AdamW's moments move to host memory"),
            std::string::npos);
  EXPECT_FALSE(status("sgd").optimizer_offload);
}

/// From step 1 on, nothing more fits before each forward.
class AlwaysTight final : public Plugin {
 public:
  std::string name() const override { return "always_tight"; }
  std::vector<Event> events() const override { return {Event::BeforeForward}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.state.global_step >= 1) set_memory_limit(kCpu, memory_stats(kCpu).allocated + 1024);
  }
};

TEST_F(MemoryLadder, ALadderThatDoesNotNameDeviceStillEndsInTheFallbackDevices) {
  // ladder = ["micro_batch"] with fallback_devices: the device rung comes after it, as before
  // there was a ladder ("cpu" is skipped: the run is there; cuda:99 is on no host).
  const RunResult r = run(
      kMlpRecipe,
      {"+plugins.oom_backoff.ladder=[\"micro_batch\"]", "+plugins.oom_backoff.fallback_devices=[\"cpu\", \"cuda:99\"]"},
      "fallback", {std::make_shared<AlwaysTight>()});
  EXPECT_EQ(r.exit_code, kExitTrainingFailed);
  EXPECT_NE(r.message.find("switch_device cuda:99: this process sees "), std::string::npos) << r.message;
  EXPECT_NE(log("fallback").find("oom_backoff: cpu exhausted at micro-batch 1, falling back to cuda:99"),
            std::string::npos);
}

TEST_F(MemoryLadder, ALadderThatNamesARungTwiceOrAutoAmongRungsIsAUsageError) {
  for (const char* ladder : {"[\"checkpoint\", \"checkpoint\"]", "[\"auto\", \"device\"]", "[]"}) {
    SCOPED_TRACE(ladder);
    const RunResult r = fit(kMlpRecipe, {std::string("+plugins.oom_backoff.ladder=") + ladder}, "bad");
    EXPECT_EQ(r.exit_code, kExitUsage) << r.message;
    EXPECT_NE(r.message.find("plugins.oom_backoff.ladder"), std::string::npos) << r.message;
  }
  const RunResult r = fit(kMlpRecipe, {"+plugins.oom_backoff.ladder=[\"swap\"]"}, "unknown");
  EXPECT_EQ(r.exit_code, kExitUsage) << r.message;
  EXPECT_NE(r.message.find("swap"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace trainer
