// model.weights: state_dicts written by Debian's python3-torch / python3-torchvision
// (tests/model/torchvision_fixtures.py, run by ctest as the fixture "torchvision_files") load
// into the registry's ResNet and ViT and give torchvision's logits; a trainer checkpoint loads
// too; what does not fit is refused with the first offending name.
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <algorithm>

#include "support/hostile_archive.h"
#include "support/test_util.h"
#include "trainer/error.h"
#include "trainer/model.h"

namespace trainer {
namespace {

using testing::read_file;

const std::string kDir = TRAINER_TORCHVISION_FIXTURES;

// The state_dicts are read by trainer's own reader of torch.save's format (LibTorch 1.13's
// pickle_load turns their OrderedDict into None); the plain dicts of inputs and logits below by
// LibTorch's, independently.

std::shared_ptr<Model> model(const std::string& toml, const DataSpec& data) {
  torch::manual_seed(11);
  return build_model(Config::parse(toml), data);
}

/// {"input": x, "logits": y} as the fixture script saved it.
std::pair<at::Tensor, at::Tensor> io(const std::string& name) {
  const std::string bytes = read_file(kDir + "/" + name + "_io.pt");
  const auto dict = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
  return {dict.at("input").toTensor(), dict.at("logits").toTensor()};
}

/// The largest difference between `m`'s eval-mode logits and torchvision's in <name>_io.pt,
/// relative to the largest of torchvision's logits (the perturbed ResNets' reach 1e7).
double diff_to_torchvision(Model& m, const std::string& name) {
  const auto [x, expected] = io(name);
  m.eval();
  torch::NoGradGuard no_grad;
  const at::Tensor out = m.forward(x);
  EXPECT_EQ(out.sizes(), expected.sizes());
  return (out - expected).abs().max().item<double>() / std::max(1.0, expected.abs().max().item<double>());
}

/// Loads <name>.pt and compares the eval-mode logits with torchvision's on the same input.
double logits_diff(Model& m, const std::string& name) {
  const WeightsReport r = load_weights(m, kDir + "/" + name + ".pt");
  EXPECT_EQ(r.format, "torch.save state_dict");
  EXPECT_TRUE(r.excluded.empty());
  return diff_to_torchvision(m, name);
}

// Tolerance, relative to the largest logit: float32 summed in another order (torchvision's
// attention runs in one fused op, trainer's in matmuls; a LibTorch 2.x build has other kernels
// than the Debian 1.13 that wrote the logits: with LibTorch 2.11, 7e-7 measured for the
// ResNet-18, 1.6e-5 for the ViT-B/16). A tensor loaded into the wrong place, or not at all,
// moves the logits by 1e-2 of their size or more.
/// The UsageError message of loading `file` into `m`, "" when it loads.
std::string refusal(Model& m, const std::string& file, const std::vector<std::string>& exclude = {}) {
  try {
    load_weights(m, file, exclude);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Weights, TorchvisionResnet18GivesTorchvisionsLogits) {
  auto m = model("name = \"resnet\"\ndepth = 18\n", DataSpec{{3, 64, 64}, 10});
  EXPECT_LE(logits_diff(*m, "resnet18"), 1e-4);
}

TEST(Weights, TorchvisionResnet50GivesTorchvisionsLogits) {
  auto m = model("name = \"resnet\"\ndepth = 50\n", DataSpec{{3, 64, 64}, 10});
  EXPECT_LE(logits_diff(*m, "resnet50"), 1e-4);
}

TEST(Weights, TorchvisionVitGivesTorchvisionsLogits) {
  auto m = model("name = \"vit\"\npatch_size = 8\nnum_layers = 2\nnum_heads = 4\nhidden_dim = 64\nmlp_dim = 128\n",
                 DataSpec{{3, 32, 32}, 10});
  EXPECT_LE(logits_diff(*m, "vit_tiny"), 1e-4);
}

TEST(Weights, TorchvisionVitB16GivesTorchvisionsLogits) {
  const std::string vit_b_16 = read_file(std::string(TRAINER_SOURCE_DIR) + "/configs/model/vit_b_16.toml");
  auto m = model(vit_b_16, DataSpec{{3, 224, 224}, 1000});
  EXPECT_LE(logits_diff(*m, "vit_b_16"), 1e-4);
}

TEST(Weights, WrappedStateDictWithModulePrefixLoads) {
  auto m = model("name = \"resnet\"\ndepth = 18\n", DataSpec{{3, 64, 64}, 10});
  const WeightsReport r = load_weights(*m, kDir + "/resnet18_wrapped.pt");
  EXPECT_EQ(r.loaded, 122);  // 62 parameters and 60 buffers (3 per BatchNorm)
  EXPECT_LE(diff_to_torchvision(*m, "resnet18"), 1e-4);
}

TEST(Weights, OlderFilesWithoutNumBatchesTrackedLoad) {
  auto m = model("name = \"resnet\"\ndepth = 18\n", DataSpec{{3, 64, 64}, 10});
  EXPECT_EQ(load_weights(*m, kDir + "/resnet18_no_nbt.pt").loaded, 102);  // 122 less 20 counters
  EXPECT_LE(diff_to_torchvision(*m, "resnet18"), 1e-4);
}

TEST(Weights, AnExcludePatternThatMatchesNothingIsRefused) {
  auto m = model("name = \"resnet\"\ndepth = 18\n", DataSpec{{3, 64, 64}, 10});
  const std::string msg = refusal(*m, kDir + "/resnet18.pt", {"heads.*"});
  EXPECT_NE(msg.find("model.weights_exclude: 'heads.*' matches no tensor"), std::string::npos) << msg;
}

TEST(Weights, NothingInTheFileIsExecuted) {
  // resnet18_payload.pt holds an object whose unpickling in Python runs os.system("touch ...").
  auto m = model("name = \"resnet\"\ndepth = 18\n", DataSpec{{3, 64, 64}, 10});
  EXPECT_EQ(load_weights(*m, kDir + "/resnet18_payload.pt").loaded, 122);
  EXPECT_FALSE(std::filesystem::exists(kDir + "/payload_ran"));
}

TEST(Weights, ExcludedHeadKeepsItsInitialValuesAndTheRestLoads) {
  auto m = model("name = \"resnet\"\ndepth = 18\n", DataSpec{{3, 64, 64}, 5});
  const at::Tensor head = m->named_parameters()["fc.weight"].clone();
  const WeightsReport r = load_weights(*m, kDir + "/resnet18.pt", {"fc.*"});
  EXPECT_EQ(r.loaded, 120);
  EXPECT_EQ(r.excluded, (std::vector<std::string>{"fc.bias", "fc.weight"}));
  EXPECT_TRUE(m->named_parameters()["fc.weight"].equal(head));
  // A loaded tensor holds the file's values (resnet18_some.pt: two of them in a plain dict, which
  // LibTorch's own pickle_load reads).
  const std::string bytes = read_file(kDir + "/resnet18_some.pt");
  const auto sd = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
  EXPECT_TRUE(m->named_parameters()["layer3.1.conv2.weight"].equal(sd.at("layer3.1.conv2.weight").toTensor()));
  EXPECT_TRUE(m->named_parameters()["layer4.1.conv1.weight"].equal(sd.at("layer4.1.conv1.weight").toTensor()));
}

TEST(Weights, WhatDoesNotFitIsRefusedNamingTheFirstOffenderAndNothingChanges) {
  auto five = model("name = \"resnet\"\ndepth = 18\n", DataSpec{{3, 64, 64}, 5});
  const at::Tensor before = five->named_parameters()["conv1.weight"].clone();
  std::string msg = refusal(*five, kDir + "/resnet18.pt");
  EXPECT_NE(msg.find("2 mis-shaped or mis-typed, the first fc.bias (file [10], model [5])"), std::string::npos) << msg;
  EXPECT_NE(msg.find(kDir + "/resnet18.pt"), std::string::npos) << msg;
  EXPECT_TRUE(five->named_parameters()["conv1.weight"].equal(before));

  auto r34 = model("name = \"resnet\"\ndepth = 34\n", DataSpec{{3, 64, 64}, 10});
  msg = refusal(*r34, kDir + "/resnet18.pt");
  EXPECT_NE(msg.find("missing from the file, the first 'layer1.2.bn1.bias'"), std::string::npos) << msg;

  auto r18 = model("name = \"resnet\"\ndepth = 18\n", DataSpec{{3, 64, 64}, 10});
  msg = refusal(*r18, kDir + "/resnet50.pt");
  EXPECT_NE(msg.find("not in the model, the first 'layer1.0.bn3.bias'"), std::string::npos) << msg;

  auto small = model("name = \"resnet\"\ndepth = 18\nstem = \"small\"\n", DataSpec{{3, 64, 64}, 10});
  msg = refusal(*small, kDir + "/resnet18.pt");
  EXPECT_NE(msg.find("conv1.weight (file [64, 3, 7, 7], model [64, 3, 3, 3])"), std::string::npos) << msg;
}

TEST(Weights, UnreadableFilesAreRefusedSayingHowToResave) {
  testing::TempDir tmp;
  auto m = model("name = \"resnet\"\ndepth = 18\n", DataSpec{{3, 64, 64}, 10});
  std::string msg = refusal(*m, tmp / "absent.pt");
  EXPECT_NE(msg.find("absent.pt\": no such file"), std::string::npos) << msg;
  testing::write_file(tmp / "text.pt", "not a checkpoint\n");
  msg = refusal(*m, tmp / "text.pt");
  EXPECT_NE(msg.find("is neither a safetensors file nor a zip archive"), std::string::npos) << msg;
  // torch.save(..., _use_new_zipfile_serialization=False): the pre-1.6 format.
  msg = refusal(*m, kDir + "/resnet18_legacy.pt");
  EXPECT_NE(msg.find("re-save it in Python with torch.save(model.state_dict(), path)"), std::string::npos) << msg;
  // A torch.save file that is not a dict of tensors.
  const auto [x, logits] = io("resnet18");
  const auto bytes = torch::jit::pickle_save(x);
  testing::write_file(tmp / "tensor.pt", std::string(bytes.begin(), bytes.end()));
  msg = refusal(*m, tmp / "tensor.pt");
  EXPECT_NE(msg.find("holds a Tensor, not a state_dict"), std::string::npos) << msg;
}

class WeightsRun : public testing::TrainerTest {};

constexpr const char* kResnetRun = R"(
[run]
name = "t"
seed = 3
[model]
name = "resnet"
depth = 18
stem = "small"
[dataset]
name = "synthetic"
size = 32
eval_size = 16
shape = [3, 8, 8]
[training]
epochs = 1
batch_size = 16
[optim]
name = "sgd"
lr = 0.1
[metrics]
console = false
)";

TEST_F(WeightsRun, TrainerCheckpointLoadsAsInitialWeights) {
  Trainer first(options_for(kResnetRun, {}, "first"));
  ASSERT_EQ(first.fit().exit_code, 0);
  const std::string ckpt = tmp_ / "first/checkpoints/step_00000002.pt";
  ASSERT_TRUE(std::filesystem::exists(ckpt));
  // Two models of different initial draws hold the same values once loaded, all 122 tensors.
  const Config section = Config::parse(read_file(tmp_ / "recipe.toml")).sub("model");
  torch::manual_seed(1);
  auto a = build_model(section, DataSpec{{3, 8, 8}, 10});
  torch::manual_seed(2);
  auto b = build_model(section, DataSpec{{3, 8, 8}, 10});
  const at::Tensor initial = a->named_parameters()["layer2.0.conv1.weight"].clone();
  const WeightsReport ra = load_weights(*a, ckpt), rb = load_weights(*b, ckpt);
  EXPECT_EQ(ra.format, "trainer checkpoint");
  EXPECT_EQ(ra.loaded, 122);
  EXPECT_EQ(rb.loaded, 122);
  for (const auto& p : a->named_parameters()) EXPECT_TRUE(p.value().equal(b->named_parameters()[p.key()])) << p.key();
  for (const auto& p : a->named_buffers()) EXPECT_TRUE(p.value().equal(b->named_buffers()[p.key()])) << p.key();
  EXPECT_FALSE(a->named_parameters()["layer2.0.conv1.weight"].equal(initial));
  // Training moved the BatchNorm statistics: they come from the checkpoint, not the defaults.
  EXPECT_EQ(a->named_buffers()["bn1.num_batches_tracked"].item<std::int64_t>(), 2);

  // And as a run's model.weights: the second run starts from the first one's end.
  auto o = options_for(kResnetRun, {"model.weights=\"" + ckpt + "\"", "training.max_steps=1"}, "second");
  o.log_level = "info";
  Trainer second(std::move(o));
  EXPECT_EQ(second.fit().exit_code, 0);
  EXPECT_NE(
      read_file(tmp_ / "second/trainer.log").find("model weights: 122 tensors from " + ckpt + " (trainer checkpoint)"),
      std::string::npos);
}

TEST_F(WeightsRun, ARunDirectoryGivesItsNewestCompleteCheckpoint) {
  Trainer first(
      options_for(kResnetRun, {"training.epochs=2", "checkpoint.every_epochs=1", "checkpoint.keep_last=2"}, "first"));
  ASSERT_EQ(first.fit().exit_code, 0);
  const std::filesystem::path ckpts(tmp_ / "first/checkpoints");
  const std::string run_dir = tmp_ / "first";
  ASSERT_TRUE(std::filesystem::exists(ckpts / "step_00000002.pt"));
  ASSERT_TRUE(std::filesystem::exists(ckpts / "step_00000004.pt"));
  const auto run_from = [&](const std::string& weights, const std::string& name) {
    auto o = options_for(kResnetRun, {"model.weights=\"" + weights + "\"", "training.max_steps=1"}, name);
    o.log_level = "info";
    Trainer t(std::move(o));
    return t.fit();
  };
  // The run directory and its checkpoints/ directory: the checkpoint `latest` names.
  ASSERT_EQ(run_from(run_dir, "a").exit_code, 0);
  EXPECT_NE(read_file(tmp_ / "a/trainer.log")
                .find("model weights: 122 tensors from " + (ckpts / "step_00000004.pt").string()),
            std::string::npos);
  ASSERT_EQ(run_from(ckpts.string(), "b").exit_code, 0);
  EXPECT_NE(read_file(tmp_ / "b/trainer.log").find("from " + (ckpts / "step_00000004.pt").string()), std::string::npos);
  // The newest one cut short: its digest says so, and the one before it is taken.
  std::filesystem::resize_file(ckpts / "step_00000004.pt", 100);
  ASSERT_EQ(run_from(run_dir, "c").exit_code, 0);
  EXPECT_NE(read_file(tmp_ / "c/trainer.log").find("from " + (ckpts / "step_00000002.pt").string()), std::string::npos);
  EXPECT_NE(
      read_file(tmp_ / "c/trainer.log")
          .find("model.weights: checkpoint " + (ckpts / "step_00000004.pt").string() + " is truncated or damaged"),
      std::string::npos);
  // None complete: exit code 2, naming the setting and the directory.
  std::filesystem::resize_file(ckpts / "step_00000002.pt", 100);
  auto r = run_from(run_dir, "d");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("model.weights = \"" + run_dir + "\": no complete checkpoint"), std::string::npos)
      << r.message;
  // A directory without checkpoints.
  std::filesystem::create_directories(tmp_ / "empty");
  r = run_from(std::string(tmp_ / "empty"), "e");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(
      r.message.find("model.weights " + std::string(tmp_ / "empty") + ": no checkpoints/latest and no step_<N>.pt"),
      std::string::npos)
      << r.message;
}

TEST_F(WeightsRun, ResumingDoesNotNeedTheWeightsFileAnyMore) {
  Trainer first(options_for(kResnetRun, {}, "first"));
  ASSERT_EQ(first.fit().exit_code, 0);
  const std::string init = tmp_ / "init.pt";
  std::filesystem::copy_file(tmp_ / "first/checkpoints/step_00000002.pt", init);
  Trainer second(options_for(kResnetRun, {"model.weights=\"" + init + "\""}, "second"));
  ASSERT_EQ(second.fit().exit_code, 0);
  std::filesystem::remove(init);  // moved or deleted since; the run's checkpoint holds the model
  auto o = options_for(kResnetRun, {"model.weights=\"" + init + "\"", "training.epochs=2"}, "third");
  o.resume = tmp_ / "second";
  o.log_level = "info";
  Trainer resumed(std::move(o));
  const auto r = resumed.fit();
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_NE(read_file(tmp_ / "third/trainer.log").find("model weights: " + init + " not loaded"), std::string::npos);
}

TEST_F(WeightsRun, ATorchScriptArchiveThatWouldRunCodeFailsTheRunWithExitCode2AndNothingRuns) {
  // A TorchScript archive (what a trainer checkpoint is) whose class's __setstate__ creates a
  // file when LibTorch's reader (torch::jit::load) reads it.
  const std::string file = tmp_ / "weights.pt", marker = tmp_ / "ran";
  testing::write_file(file, testing::hostile_archive(marker));
  Trainer t(options_for(kResnetRun, {"model.weights=\"" + file + "\""}, "run"));
  const auto r = t.fit();
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("model.weights = \"" + file +
                           "\": a TorchScript archive that is not a trainer checkpoint: code/__torch__.py declares a "
                           "method"),
            std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("model.name = \"torchscript\" with model.path, which runs its code"), std::string::npos)
      << r.message;
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST_F(WeightsRun, WeightsThatDoNotFitFailTheRunWithExitCode2) {
  Trainer t(options_for(kResnetRun, {"model.weights=\"" + kDir + "/resnet18.pt\""}, "bad"));
  const auto r = t.fit();
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.message.find("conv1.weight (file [64, 3, 7, 7], model [64, 3, 3, 3])"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace trainer
