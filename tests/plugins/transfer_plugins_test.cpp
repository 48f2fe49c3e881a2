// The lora and linear_probe plugins (.so) in real runs: what trains and what stays
// bit-identical (also BatchNorm statistics under a probe), what the optimizer holds, the files
// each writes and that they load back (model.weights, adapters), checkpoints of what trains over
// the digest of the frozen base, an exact resume, cached
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
  /// The override that starts a run of kResnetRecipe from weights read from a file (the
  /// checkpoint of a plain epoch of it): the frozen base of a probe's checkpoints.
  std::string base_weights() {
    const RunResult r = run(kResnetRecipe, {"plugins.load=[]", "training.epochs=1"}, "base");
    EXPECT_EQ(r.exit_code, kExitOk) << r.message;
    return "model.weights=\"" + checkpoint("base", 3) + "\"";
  }
  std::shared_ptr<Model> model_;
};

/// A checkpoint's format, and the digest of its frozen base ("" when it records none).
std::int64_t format_of(const std::string& file, std::string& frozen_base) {
  torch::serialize::InputArchive ar;
  ar.load_from(file);
  c10::IValue base;
  frozen_base = ar.try_read("frozen_base", base) && base.isString() ? base.toStringRef() : "";
  at::Tensor format;
  ar.read("format", format);
  return format.item<std::int64_t>();
}

TEST_F(TransferPlugins, LoraTrainsAdaptersAndHeadOnlyAndTheBaseStaysBitIdentical) {
  fix_threads();
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
  fix_threads();
  const RunResult whole = run(kVitRecipe, {}, "whole");
  ASSERT_EQ(whole.exit_code, kExitOk) << whole.message;
  const Tensors expected = state_of(*model_);
  // Its frozen weights are a random initialisation, which no file gives again (nor another CPU,
  // whose kernels draw it otherwise): the checkpoints hold the whole model.
  std::string base;
  EXPECT_EQ(format_of(checkpoint("whole", 6), base), 2);
  EXPECT_EQ(base, "");
  const RunResult resumed = run(kVitRecipe, {}, "resumed", {}, checkpoint("whole", 6));
  ASSERT_EQ(resumed.exit_code, kExitOk) << resumed.message;
  for (const auto& [name, t] : state_of(*model_)) EXPECT_TRUE(torch::equal(t, expected.at(name))) << name;
}

// A LoRA run over weights read from a file checkpoints what trains (adapters, head, their
// optimizer state) with the digest of the frozen weights, not the weights: a small file, which
// resumes exactly over the same file. Another base is refused, at a resume and for its adapters,
// and model.weights refuses such a checkpoint. (Over a random initialisation, which no file
// gives again, checkpoints hold the whole model: LoraResumesExactly.)
TEST_F(TransferPlugins, LoraCheckpointsHoldWhatTrainsOverTheDigestOfTheBase) {
  fix_threads();
  // The base: the checkpoint of a plain run of the same ViT (whole: everything trains there).
  ASSERT_EQ(run(kVitRecipe, {"plugins.load=[]", "training.epochs=1"}, "base").exit_code, kExitOk);
  const std::string weights = "model.weights=\"" + checkpoint("base", 6) + "\"";
  ASSERT_EQ(run(kVitRecipe, {weights, "plugins.lora.export_merged=true"}, "lora").exit_code, kExitOk);
  const Tensors trained = state_of(*model_);
  std::string base, none;
  EXPECT_EQ(format_of(checkpoint("lora", 6), base), 3);
  EXPECT_EQ(base.rfind("frozen-digest-v1:", 0), 0u) << base;
  EXPECT_NE(base.find(" tensors, "), std::string::npos) << base;
  EXPECT_EQ(format_of(checkpoint("base", 6), none), 2);  // a model that trains whole: as before
  EXPECT_EQ(none, "");
  // 1,924 parameters train of about 40 k: the checkpoint holds them with AdamW's two moments.
  EXPECT_LT(fs::file_size(checkpoint("lora", 6)) * 4, fs::file_size(checkpoint("base", 6)));
  torch::serialize::InputArchive ar, model, sub;
  ar.load_from(checkpoint("lora", 6));
  ar.read("model", model);
  EXPECT_TRUE(model.try_read("heads", sub));       // the head trains
  EXPECT_FALSE(model.try_read("conv_proj", sub));  // the patch embedding is frozen

  // Resumed over the same file: the run's end, bit for bit.
  RunResult r = run(kVitRecipe, {weights}, "resumed", {}, checkpoint("lora", 6));
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  for (const auto& [name, t] : state_of(*model_)) EXPECT_TRUE(torch::equal(t, trained.at(name))) << name;
  // Over another base (a random initialisation; the merged weights): refused, both digests named.
  r = run(kVitRecipe, {}, "random_base", {}, checkpoint("lora", 6));
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("it holds what trained over frozen weights of digest " + base), std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("this run's frozen weights have digest frozen-digest-v1:"), std::string::npos) << r.message;
  const std::string merged = tmp_ / "lora/merged_model.pt";
  r = run(kVitRecipe, {"model.weights=\"" + merged + "\""}, "other_base", {}, checkpoint("lora", 6));
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("frozen weights of digest " + base), std::string::npos) << r.message;
  // Another split of what trains (the head frozen too) is another base.
  r = run(kVitRecipe, {weights, "plugins.lora.train_head=false"}, "frozen_head", {}, checkpoint("lora", 6));
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("frozen weights of digest " + base), std::string::npos) << r.message;
  // A weights file gone since: the refusal says it was not loaded.
  r = run(kVitRecipe, {"model.weights=\"" + (tmp_ / "gone.pt") + "\""}, "gone", {}, checkpoint("lora", 6));
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("gone.pt\" was not loaded"), std::string::npos) << r.message;
  // model.weights takes whole models only.
  r = run(kVitRecipe, {"model.weights=\"" + checkpoint("lora", 6) + "\"", "plugins.load=[]"}, "as_weights");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("a checkpoint of a run that trained part of its model"), std::string::npos) << r.message;
  // The adapters file records its base too.
  r = run(kVitRecipe,
          {"model.weights=\"" + merged + "\"", "+plugins.lora.adapters=\"" + (tmp_ / "lora/lora_adapters.pt") + "\""},
          "adapters_other_base");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("were trained over frozen weights of digest " + base), std::string::npos) << r.message;
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
  const std::string weights = base_weights();
  auto snap = std::make_shared<Snapshot>();
  const RunResult r = run(kResnetRecipe, {weights}, "probe", {snap});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(snap->optimized, 512 * 3 + 3);
  for (const auto& [name, end] : state_of(*model_)) {
    if (name.rfind("fc.", 0) == 0) {
      EXPECT_FALSE(torch::equal(end, snap->start.at(name))) << name;
    } else {
      EXPECT_TRUE(torch::equal(end, snap->start.at(name))) << name;  // running_mean/var and counters too
    }
  }
  // Checkpoints hold the head and the buffers over the digest of the frozen backbone.
  std::string base;
  EXPECT_EQ(format_of(checkpoint("probe", 6), base), 3);
  EXPECT_NE(base.find("frozen-digest-v1:"), std::string::npos);
  torch::serialize::InputArchive ar, model, sub;
  ar.load_from(checkpoint("probe", 6));
  ar.read("model", model);
  EXPECT_TRUE(model.try_read("fc", sub));
  at::Tensor weight;
  EXPECT_FALSE(model.try_read("conv1", sub) && sub.try_read("weight", weight));  // the stem's weight is frozen
  // The whole model (backbone and trained head) only with export_model, in a file model.weights loads.
  EXPECT_FALSE(fs::exists(tmp_ / "probe/probe_model.pt"));
  ASSERT_EQ(run(kResnetRecipe, {weights, "+plugins.linear_probe.export_model=true"}, "exported").exit_code, kExitOk);
  const std::string file = tmp_ / "exported/probe_model.pt";
  ASSERT_TRUE(fs::exists(file));
  auto plain =
      build_model(Config::parse("name = \"resnet\"\ndepth = 18\nstem = \"small\"\n"), DataSpec{{1, 12, 12}, 3});
  load_weights(*plain, file);
  for (const auto& [name, t] : state_of(*plain)) EXPECT_TRUE(torch::equal(t, state_of(*model_).at(name))) << name;
}

TEST_F(TransferPlugins, CachedFeaturesTrainTheSameHeadAsTheBackboneEveryStep) {
  fix_threads();
  const std::string weights = base_weights();
  const RunResult plain = run(kResnetRecipe, {weights}, "every_step");
  ASSERT_EQ(plain.exit_code, kExitOk) << plain.message;
  const Tensors expected = state_of(*model_);
  auto snap = std::make_shared<Snapshot>();
  const RunResult cached = run(kResnetRecipe, {weights, "+plugins.linear_probe.cache_features=true"}, "cached", {snap});
  ASSERT_EQ(cached.exit_code, kExitOk) << cached.message;
  EXPECT_EQ(snap->optimized, 512 * 3 + 3);
  // The cached run's model is the head, with the full model as its child "model".
  const Tensors got = state_of(*model_, "model.");
  EXPECT_LT((got.at("fc.weight") - expected.at("fc.weight")).abs().max().item<double>(), 1e-5);
  EXPECT_LT((got.at("fc.bias") - expected.at("fc.bias")).abs().max().item<double>(), 1e-5);
  EXPECT_TRUE(torch::equal(got.at("layer1.0.bn1.running_mean"), expected.at("layer1.0.bn1.running_mean")));
  EXPECT_DOUBLE_EQ(cached.final_metrics.at("eval/accuracy"), plain.final_metrics.at("eval/accuracy"));
  EXPECT_NEAR(cached.final_metrics.at("eval/loss"), plain.final_metrics.at("eval/loss"), 1e-5);
  EXPECT_FALSE(fs::exists(tmp_ / "cached/probe_model.pt"));  // export_model is off

  // A resumed cached run computes the features again from the backbone of model.weights, under
  // the head the checkpoint holds.
  std::string base;
  EXPECT_EQ(format_of(checkpoint("cached", 3), base), 3);
  const RunResult resumed = run(kResnetRecipe, {weights, "+plugins.linear_probe.cache_features=true"}, "resumed", {},
                                checkpoint("cached", 3));
  ASSERT_EQ(resumed.exit_code, kExitOk) << resumed.message;
  const Tensors after = state_of(*model_, "model.");
  EXPECT_TRUE(torch::equal(after.at("fc.weight"), got.at("fc.weight")));
}

// Ctrl-C while the probe caches its features ends the run there (exit code 130), before any
// step: no checkpoint and no probe_model.pt hold an untrained head. Without the cache the loop
// stops before its first step, and the head is not written either.
TEST_F(TransferPlugins, CtrlCWhileFeaturesAreCachedSavesNoUntrainedHead) {
  const RunResult r =
      run(kResnetRecipe, {"+plugins.linear_probe.cache_features=true", "+plugins.linear_probe.export_model=true"},
          "cached", {std::make_shared<InterruptBeforeFit>()});
  clear_interrupt();
  EXPECT_EQ(r.exit_code, kExitInterrupted) << r.message;
  EXPECT_EQ(r.status, RunStatus::Killed);
  EXPECT_NE(r.message.find("interrupted by a signal while caching the probe's features"), std::string::npos)
      << r.message;
  EXPECT_EQ(r.global_step, 0);
  EXPECT_TRUE(r.last_checkpoint.empty()) << r.last_checkpoint;
  EXPECT_FALSE(fs::exists(tmp_ / "cached/probe_model.pt"));

  const RunResult plain = run(kResnetRecipe, {"+plugins.linear_probe.export_model=true"}, "plain",
                              {std::make_shared<InterruptBeforeFit>()});
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
