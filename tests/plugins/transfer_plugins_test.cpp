// The lora and linear_probe plugins (.so) in real runs: what trains and what stays
// bit-identical (also BatchNorm statistics under a probe), what the optimizer holds, the files
// each writes and that they load back (model.weights, adapters), an exact resume, cached
// features training the same head as the backbone run every step, Ctrl-C while they are cached
// saving nothing untrained, and exit code 2 for settings that cannot work.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "support/test_util.h"
#include "trainer/interrupt.h"
#include "trainer/layers.h"
#include "trainer/lora.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

constexpr const char* kVitRecipe = R"(
[run]
seed = 5
[model]
name = "vit"
patch_size = 7
num_layers = 2
hidden_dim = 32
num_heads = 2
mlp_dim = 64
[dataset]
name = "synthetic"
size = 96
eval_size = 32
shape = [1, 28, 28]
num_classes = 4
[training]
epochs = 2
batch_size = 16
[optim]
name = "adamw"
lr = 0.01
weight_decay = 0.1
[eval]
every_epochs = 1
[checkpoint]
every_epochs = 1
keep_last = 5
[metrics]
console = false
[plugins]
load = ["lora"]
[plugins.lora]
rank = 4
alpha = 8
targets = ["*.q_proj", "*.v_proj", "*.mlp.0"]
)";

constexpr const char* kResnetRecipe = R"(
[run]
seed = 5
[model]
name = "resnet"
depth = 18
stem = "small"
[dataset]
name = "synthetic"
size = 48
eval_size = 16
shape = [1, 12, 12]
num_classes = 3
[training]
epochs = 2
batch_size = 16
[optim]
name = "sgd"
lr = 0.1
[eval]
every_epochs = 1
[checkpoint]
every_epochs = 1
keep_last = 5
[metrics]
console = false
[plugins]
load = ["linear_probe"]
)";

using Tensors = std::map<std::string, at::Tensor>;

/// The recipe with an MLP (no head to split off, no adaptable layer) for its model.
std::string with_mlp(const std::string& recipe) {
  const auto begin = recipe.find("[model]"), end = recipe.find("[dataset]");
  return recipe.substr(0, begin) + "[model]\nname = \"mlp\"\n" + recipe.substr(end);
}

Tensors state_of(torch::nn::Module& m, const std::string& strip = "") {
  Tensors out;
  for (const auto& p : m.named_parameters()) out[p.key().substr(strip.size())] = p.value().detach().clone();
  for (const auto& b : m.named_buffers()) out[b.key().substr(strip.size())] = b.value().detach().clone();
  return out;
}

/// The model's state after ModelCreated's changes (at ModelToDevice) and the optimizer's size.
class Snapshot final : public Plugin {
 public:
  std::string name() const override { return "snapshot"; }
  std::vector<Event> events() const override { return {Event::ModelToDevice, Event::OptimizerCreated}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::ModelToDevice) {
      start = state_of(*ctx.model);
      trainable = 0;
      for (const auto& p : ctx.model->parameters()) trainable += p.requires_grad() ? p.numel() : 0;
    } else {
      optimized = 0;
      for (const auto& g : ctx.optimizer->param_groups()) {
        for (const auto& p : g.params()) optimized += p.numel();
      }
    }
  }
  Tensors start;
  std::int64_t trainable = 0, optimized = 0;
};

class SkipEveryStep final : public Plugin {
 public:
  std::string name() const override { return "skip_every_step"; }
  std::vector<Event> events() const override { return {Event::BatchStart}; }
  void on_event(EventContext&, Control& control) override { control.skip_step = true; }
};

/// Raises the interrupt flag at OptimizerCreated, as Ctrl-C arriving then would: after the
/// probe's ModelCreated, before its FitStart.
class InterruptBeforeFit final : public Plugin {
 public:
  std::string name() const override { return "interrupt_before_fit"; }
  std::vector<Event> events() const override { return {Event::OptimizerCreated}; }
  void on_event(EventContext&, Control&) override { request_interrupt(); }
};

class TransferPlugins : public testing::TrainerTest {
 protected:
  RunResult run(const char* recipe, const std::vector<std::string>& overrides, const std::string& name,
                std::vector<std::shared_ptr<Plugin>> extra = {}, const std::string& resume = "") {
    TrainerOptions o = options_for(recipe, overrides, name, std::move(extra));
    o.resume = resume;
    Trainer t(std::move(o));
    RunResult r = t.fit();
    model_ = t.model();
    return r;
  }
  std::string checkpoint(const std::string& run, int step) {
    char file[32];
    std::snprintf(file, sizeof file, "step_%08d.pt", step);
    return tmp_ / (run + "/checkpoints/" + file);
  }
  std::shared_ptr<Model> model_;
};

TEST_F(TransferPlugins, LoraTrainsAdaptersAndHeadOnlyAndTheBaseStaysBitIdentical) {
  auto snap = std::make_shared<Snapshot>();
  const RunResult r = run(kVitRecipe, {"plugins.lora.export_merged=true"}, "lora", {snap});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  // Adapters of 2 layers x (q 4*64, v 4*64, mlp.0 4*96) and the head 32*4+4.
  const std::int64_t expected = 2 * (4 * 64 + 4 * 64 + 4 * 96) + 32 * 4 + 4;
  EXPECT_EQ(snap->trainable, expected);
  EXPECT_EQ(snap->optimized, expected);
  std::int64_t changed = 0, same = 0;
  for (const auto& [name, end] : state_of(*model_)) {
    const bool trains = name.find(".lora.") != std::string::npos || name.rfind("heads.", 0) == 0;
    if (trains) {
      changed += !torch::equal(end, snap->start.at(name));
    } else {
      EXPECT_TRUE(torch::equal(end, snap->start.at(name))) << name << " changed although frozen (weight decay 0.1)";
      ++same;
    }
  }
  EXPECT_EQ(changed, 2 * 3 * 2 + 2);  // every A, B and the head's weight and bias moved
  EXPECT_GT(same, 20);

  // The adapters alone, small; the merged model loads as model.weights of a plain ViT and
  // computes what the adapted one does.
  const std::string adapters = tmp_ / "lora/lora_adapters.pt", merged = tmp_ / "lora/merged_model.pt";
  ASSERT_TRUE(fs::exists(adapters));
  ASSERT_TRUE(fs::exists(merged));
  EXPECT_LT(fs::file_size(adapters) * 2, fs::file_size(merged));
  auto plain = build_model(Config::parse("name = \"vit\"\npatch_size = 7\nnum_layers = 2\nhidden_dim = 32\n"
                                         "num_heads = 2\nmlp_dim = 64\n"),
                           DataSpec{{1, 28, 28}, 4});
  load_weights(*plain, merged);
  plain->eval();
  model_->eval();
  const at::Tensor x = torch::randn({4, 1, 28, 28});
  EXPECT_LT((plain->forward(x) - model_->forward(x)).abs().max().item<double>(), 1e-5);

  // plugins.lora.adapters starts a run from them: with every step skipped, its evaluation
  // equals the end of this run.
  const RunResult again = run(kVitRecipe, {"+plugins.lora.adapters=\"" + adapters + "\"", "training.epochs=1"}, "again",
                              {std::make_shared<SkipEveryStep>()});
  ASSERT_EQ(again.exit_code, kExitOk) << again.message;
  EXPECT_NEAR(again.final_metrics.at("eval/loss"), r.final_metrics.at("eval/loss"), 1e-6);
}

TEST_F(TransferPlugins, LoraResumesExactly) {
  const RunResult whole = run(kVitRecipe, {}, "whole");
  ASSERT_EQ(whole.exit_code, kExitOk) << whole.message;
  const Tensors expected = state_of(*model_);
  const RunResult resumed = run(kVitRecipe, {}, "resumed", {}, checkpoint("whole", 6));
  ASSERT_EQ(resumed.exit_code, kExitOk) << resumed.message;
  for (const auto& [name, t] : state_of(*model_)) EXPECT_TRUE(torch::equal(t, expected.at(name))) << name;
}

TEST_F(TransferPlugins, LoraSettingsThatCannotWorkAreUsageErrors) {
  RunResult r = run(kVitRecipe, {"plugins.lora.targets=[\"*.query\"]"}, "bad_target");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("plugins.lora: LoRA target '*.query' matches no"), std::string::npos) << r.message;
  r = run(with_mlp(kVitRecipe).c_str(), {"plugins.lora.targets=[\"*\"]", "plugins.lora.train_head=false"}, "mlp");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("no adaptable layer"), std::string::npos) << r.message;
  r = run(kVitRecipe, {"+plugins.lora.adapters=\"" + (tmp_ / "none.pt") + "\""}, "no_file");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("none.pt\": no such file"), std::string::npos) << r.message;
}

TEST_F(TransferPlugins, LinearProbeLeavesTheBackboneBitIdenticalStatisticsIncluded) {
  auto snap = std::make_shared<Snapshot>();
  const RunResult r = run(kResnetRecipe, {}, "probe", {snap});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(snap->optimized, 512 * 3 + 3);
  for (const auto& [name, end] : state_of(*model_)) {
    if (name.rfind("fc.", 0) == 0) {
      EXPECT_FALSE(torch::equal(end, snap->start.at(name))) << name;
    } else {
      EXPECT_TRUE(torch::equal(end, snap->start.at(name))) << name;  // running_mean/var and counters too
    }
  }
  // The whole model (backbone and trained head) in a file model.weights loads.
  const std::string file = tmp_ / "probe/probe_model.pt";
  ASSERT_TRUE(fs::exists(file));
  auto plain =
      build_model(Config::parse("name = \"resnet\"\ndepth = 18\nstem = \"small\"\n"), DataSpec{{1, 12, 12}, 3});
  load_weights(*plain, file);
  for (const auto& [name, t] : state_of(*plain)) EXPECT_TRUE(torch::equal(t, state_of(*model_).at(name))) << name;
}

TEST_F(TransferPlugins, CachedFeaturesTrainTheSameHeadAsTheBackboneEveryStep) {
  const RunResult plain = run(kResnetRecipe, {}, "every_step");
  ASSERT_EQ(plain.exit_code, kExitOk) << plain.message;
  const Tensors expected = state_of(*model_);
  auto snap = std::make_shared<Snapshot>();
  const RunResult cached = run(kResnetRecipe, {"+plugins.linear_probe.cache_features=true"}, "cached", {snap});
  ASSERT_EQ(cached.exit_code, kExitOk) << cached.message;
  EXPECT_EQ(snap->optimized, 512 * 3 + 3);
  // The cached run's model is the head, with the full model as its child "model".
  const Tensors got = state_of(*model_, "model.");
  EXPECT_LT((got.at("fc.weight") - expected.at("fc.weight")).abs().max().item<double>(), 1e-5);
  EXPECT_LT((got.at("fc.bias") - expected.at("fc.bias")).abs().max().item<double>(), 1e-5);
  EXPECT_TRUE(torch::equal(got.at("layer1.0.bn1.running_mean"), expected.at("layer1.0.bn1.running_mean")));
  EXPECT_DOUBLE_EQ(cached.final_metrics.at("eval/accuracy"), plain.final_metrics.at("eval/accuracy"));
  EXPECT_NEAR(cached.final_metrics.at("eval/loss"), plain.final_metrics.at("eval/loss"), 1e-5);
  EXPECT_TRUE(fs::exists(tmp_ / "cached/probe_model.pt"));

  // A resumed cached run computes the features again from the checkpoint's backbone.
  const RunResult resumed =
      run(kResnetRecipe, {"+plugins.linear_probe.cache_features=true"}, "resumed", {}, checkpoint("cached", 3));
  ASSERT_EQ(resumed.exit_code, kExitOk) << resumed.message;
  const Tensors after = state_of(*model_, "model.");
  EXPECT_TRUE(torch::equal(after.at("fc.weight"), got.at("fc.weight")));
}

// Ctrl-C while the probe caches its features ends the run there (exit code 130), before any
// step: no checkpoint and no probe_model.pt hold an untrained head. Without the cache the loop
// stops before its first step, and the head is not written either.
TEST_F(TransferPlugins, CtrlCWhileFeaturesAreCachedSavesNoUntrainedHead) {
  const RunResult r = run(kResnetRecipe, {"+plugins.linear_probe.cache_features=true"}, "cached",
                          {std::make_shared<InterruptBeforeFit>()});
  clear_interrupt();
  EXPECT_EQ(r.exit_code, kExitInterrupted) << r.message;
  EXPECT_EQ(r.status, RunStatus::Killed);
  EXPECT_NE(r.message.find("interrupted by a signal while caching the probe's features"), std::string::npos)
      << r.message;
  EXPECT_EQ(r.global_step, 0);
  EXPECT_TRUE(r.last_checkpoint.empty()) << r.last_checkpoint;
  EXPECT_FALSE(fs::exists(tmp_ / "cached/probe_model.pt"));

  const RunResult plain = run(kResnetRecipe, {}, "plain", {std::make_shared<InterruptBeforeFit>()});
  clear_interrupt();
  EXPECT_EQ(plain.exit_code, kExitInterrupted) << plain.message;
  EXPECT_TRUE(plain.last_checkpoint.empty()) << plain.last_checkpoint;
  EXPECT_FALSE(fs::exists(tmp_ / "plain/probe_model.pt"));
}

TEST_F(TransferPlugins, LinearProbeNeedsAHead) {
  const RunResult r = run(with_mlp(kResnetRecipe).c_str(), {}, "mlp");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("has no classification head"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace trainer
