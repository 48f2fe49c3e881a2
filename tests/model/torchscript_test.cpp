// Model "torchscript": modules written in Python (Debian's python3-torch scripts and saves them
// in tests/model/torchscript_models.py) trained by trainer as the same Python code trains them,
// through the core's out-of-memory recovery, mixed precision and data parallelism, and what
// they leave loads back in Python. Bad files and modules exit 2 naming the file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "dist/dp_util.h"
#include "model/torchscript_support.h"
#include "support/test_util.h"
#include "trainer/memory.h"
#include "trainer/model.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using namespace ts_test;
using testing::read_file;
using testing::read_lines;
using testing::run_command;
using testing::write_file;

/// The dtype of every training forward's output.
class OutputDtypes final : public Plugin {
 public:
  std::string name() const override { return "output_dtypes"; }
  std::vector<Event> events() const override { return {Event::AfterForward}; }
  void on_event(EventContext& ctx, Control&) override { dtypes.push_back(ctx.outputs->scalar_type()); }
  std::vector<c10::ScalarType> dtypes;
};

class TrainsAsPython : public TorchScript, public ::testing::WithParamInterface<const char*> {};

// The same initial weights, the same samples in the same batches, the same loss and optimizer:
// the module trained by trainer and its class trained by a plain eager loop in Python end with
// the same parameters and BatchNorm statistics, and log the same losses. The forward runs the
// same ATen kernels on one thread in both (the scripted forward through the interpreter, without
// fusions), so the results agree to float32 rounding: the tolerances (1e-5 relative, 1e-6
// absolute) allow for a vectorised kernel summing a differently aligned buffer in another
// order, ~1e-7 per operation, grown over 8 momentum steps; a sample missed or a step
// mis-scaled moves the parameters by ~1e-3.
TEST_P(TrainsAsPython, SameParametersAndLossesAsAnEagerPythonLoop) {
  const std::string name = GetParam();
  const RunResult r = run(fixture(name + ".pt"), name);
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 8);
  const auto model = load(fixture(name + ".pt"));
  load_weights(*model, fixture(name + "_trained.pt"));
  const Tensors expected = state_of(*model);
  ASSERT_EQ(trained_.size(), expected.size());
  for (const auto& [key, t] : expected) {
    ASSERT_TRUE(trained_.count(key)) << key;
    EXPECT_TRUE(torch::allclose(trained_.at(key).to(t.scalar_type()), t, 1e-5, 1e-6))
        << key << ": largest difference " << (trained_.at(key).to(at::kDouble) - t.to(at::kDouble)).abs().max();
  }
  const std::vector<double> python = numbers_in(fixture(name + "_losses.txt"));
  const auto logged = testing::metric_by_step(r.run_dir + "/metrics.jsonl", "train/loss");
  ASSERT_EQ(logged.size(), python.size());
  for (std::size_t i = 0; i < python.size(); ++i) {
    EXPECT_NEAR(logged.at(static_cast<long>(i + 1)), python[i], 1e-5 * std::fabs(python[i])) << "step " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TrainsAsPython, ::testing::Values("cnn", "transformer"));

TEST_F(TorchScript, ParametersAndBuffersAreTheModulesUnderPythonsNames) {
  const auto model = load(fixture("cnn.pt"));
  std::vector<std::string> params, buffers;
  for (const auto& p : model->named_parameters()) params.push_back(p.key());
  for (const auto& b : model->named_buffers()) buffers.push_back(b.key());
  EXPECT_EQ(params, (std::vector<std::string>{"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "conv2.weight",
                                              "conv2.bias", "bn2.weight", "bn2.bias", "head.weight", "head.bias"}));
  EXPECT_EQ(buffers, (std::vector<std::string>{"bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
                                               "bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked"}));
  // The mirrored tensors are the module's: a change through one is seen by the other's forward.
  model->eval();
  const at::Tensor x = torch::randn({2, 1, 28, 28});
  const at::Tensor before = model->forward(x).detach();
  {
    torch::NoGradGuard no_grad;
    model->named_parameters()["head.bias"].add_(1.0);
  }
  EXPECT_TRUE(torch::allclose(model->forward(x).detach(), before + 1.0, 1e-5, 1e-5));
}

TEST_F(TorchScript, ModelDtypeConvertsFloatingTensorsOnly) {
  const auto model = load(fixture("cnn.pt"), "dtype = \"float64\"\n");
  for (const auto& p : model->named_parameters()) EXPECT_EQ(p.value().scalar_type(), at::kDouble) << p.key();
  for (const auto& b : model->named_buffers()) {
    const bool counter = b.key().find("num_batches_tracked") != std::string::npos;
    EXPECT_EQ(b.value().scalar_type(), counter ? at::kLong : at::kDouble) << b.key();
  }
  EXPECT_EQ(model->forward(torch::randn({2, 1, 28, 28}, at::kDouble)).scalar_type(), at::kDouble);
}

TEST_F(TorchScript, TrainAndEvalModesReachTheScriptedSubmodules) {
  const auto model = load(fixture("dropout.pt"));
  const at::Tensor x = torch::randn({4, 1, 28, 28});
  torch::NoGradGuard no_grad;
  model->eval();
  EXPECT_TRUE(torch::equal(model->forward(x), model->forward(x)));
  model->train();
  EXPECT_FALSE(torch::equal(model->forward(x), model->forward(x)));  // dropout(0.5) of 40 logits
  // A submodule kept in eval (as a frozen backbone is) stays so in the scripted forward.
  model->keep_in_eval(model->named_children()["drop"]);
  model->train();
  EXPECT_TRUE(torch::equal(model->forward(x), model->forward(x)));
}

TEST_F(TorchScript, FrozenParametersStayAtTheirInitialValues) {
  const Tensors initial = state_of(*load(fixture("cnn.pt")));
  const RunResult r = run(fixture("cnn.pt"), "frozen", {"model.freeze=[\"conv1.*\", \"bn1.*\"]"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  for (const char* name : {"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias"}) {
    EXPECT_TRUE(torch::equal(trained_.at(name), initial.at(name))) << name;
  }
  for (const char* name : {"conv2.weight", "bn2.weight", "head.weight"}) {
    EXPECT_FALSE(torch::equal(trained_.at(name), initial.at(name))) << name;
  }
  // BatchNorm's statistics are buffers: they follow the data whatever is frozen.
  EXPECT_FALSE(torch::equal(trained_.at("bn1.running_mean"), initial.at("bn1.running_mean")));

  const RunResult bad = run(fixture("cnn.pt"), "bad_freeze", {"model.freeze=[\"backbone.*\"]"});
  EXPECT_EQ(bad.exit_code, kExitUsage);
  EXPECT_NE(bad.message.find("model.freeze: 'backbone.*' matches no parameter"), std::string::npos) << bad.message;
  EXPECT_NE(bad.message.find("conv1.weight"), std::string::npos) << bad.message;
}

// Each: the file, a dataset override, and what the message must say.
struct BadCase {
  std::string file;
  std::vector<std::string> overrides;
  std::string says;
};

TEST_F(TorchScript, BadFilesAndModulesExitTwoNamingTheFileAndWhatIsAllowed) {
  const std::vector<BadCase> cases = {
      {fixture("missing.pt"), {}, "no such file; save the model in Python with torch.jit.script(model).save(path)"},
      {fixture("not_a_zip.pt"), {}, "not a TorchScript module file (it is not a zip archive"},
      {fixture("state_dict.pt"), {}, "a torch.save file (a pickled object such as a state_dict), not a TorchScript"},
      {fixture("two_inputs.pt"),
       {},
       "forward must take one Tensor (the batch; further arguments need defaults) and "
       "return one Tensor (the logits); it is `forward("},
      {fixture("tied.pt"), {}, "parameters 'encode.weight' and 'decode.weight' are one tensor (tied weights)"},
      {fixture("seven.pt"),
       {},
       "returned [1, 7]; the task needs outputs [1, 10] (task.name: classification: one per class"},
      {fixture("cnn.pt"),
       {"dataset.name=\"synthetic\"", "dataset.shape=[3, 8, 8]"},
       "forward failed on one sample of the dataset's shape [1, 3, 8, 8] (Float)"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const BadCase& c = cases[i];
    SCOPED_TRACE(c.file);
    std::string recipe = recipe_for(c.file);
    // The synthetic dataset has no limit keys.
    if (!c.overrides.empty()) recipe.replace(recipe.find("limit = 256\neval_limit = 64\n"), 28, "");
    Trainer t(options_for(recipe, c.overrides, "bad" + std::to_string(i)));
    const RunResult r = t.fit();
    EXPECT_EQ(r.exit_code, kExitUsage) << r.message;
    EXPECT_NE(r.message.find("model.path = \"" + c.file + "\""), std::string::npos) << r.message;
    EXPECT_NE(r.message.find(c.says), std::string::npos) << r.message;
  }
  // From the command line: exit status 2 and the message on the terminal.
  write_file(tmp_ / "bad.toml", recipe_for(fixture("two_inputs.pt")));
  const auto out =
      run_command(std::string(TRAINER_CLI) + " --recipe " + (tmp_ / "bad.toml") + " --run-dir " + (tmp_ / "cli"));
  EXPECT_EQ(out.code, kExitUsage) << out.text;
  EXPECT_NE(out.text.find("two_inputs.pt\": forward must take one Tensor"), std::string::npos) << out.text;
}

// The run directory's torchscript_model.pt (the module with the newest checkpoint's weights)
// loads with torch.jit.load in Python; the checkpoint's model is a state_dict of the class.
TEST_F(TorchScript, WhatTheRunLeavesLoadsBackInPython) {
  const RunResult r = run(fixture("cnn.pt"), "leaves");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  const std::string module = r.run_dir + "/torchscript_model.pt";
  ASSERT_TRUE(std::filesystem::exists(module));
  const auto reloaded = load(module);
  const Tensors again = state_of(*reloaded);
  for (const auto& [key, t] : trained_) EXPECT_TRUE(torch::equal(again.at(key), t)) << key;
  const auto out = run_command(std::string(TRAINER_TEST_PYTHON) + " " + TRAINER_SOURCE_DIR +
                               "/tests/model/torchscript_models.py check " + r.run_dir);
  EXPECT_EQ(out.code, 0) << out.text;
  EXPECT_NE(out.text.find("torchscript_models check: OK (16 tensors)"), std::string::npos) << out.text;
}

// The module is written through a temporary created new: a link planted at the temporary's name
// (a run directory from elsewhere) is replaced, never written through.
TEST_F(TorchScript, ALinkAtTheModulesTemporaryIsReplacedNotWrittenThrough) {
  namespace fs = std::filesystem;
  write_file(tmp_ / "outside.pt", "keep me");
  fs::create_directories(tmp_ / "planted");
  fs::create_symlink(tmp_ / "outside.pt", tmp_ / "planted/torchscript_model.pt.tmp");
  const RunResult r = run(fixture("cnn.pt"), "planted");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(read_file(tmp_ / "outside.pt"), "keep me");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(tmp_ / "planted/torchscript_model.pt")));
  const Tensors again = state_of(*load(tmp_ / "planted/torchscript_model.pt"));
  for (const auto& [key, t] : trained_) EXPECT_TRUE(torch::equal(again.at(key), t)) << key;
}

// Out of memory in the forward of steps 2 and 5: the core retries the batch in two halves of
// 16 (the same samples, the gradients accumulated) and the run ends as without the OOMs. The
// transformer has no BatchNorm, so the halves compute the same gradient; summed in two parts
// it differs by float rounding only (1e-5 relative, as the OOM tests of the built-in models).
TEST_F(TorchScript, RecoversFromOutOfMemoryWithTheSameResult) {
  ASSERT_EQ(run(fixture("transformer.pt"), "clean").exit_code, kExitOk);
  const Tensors reference = trained_;
  auto squeeze = std::make_shared<Squeeze>(std::set<std::int64_t>{1, 4});
  const RunResult r = run(fixture("transformer.pt"), "squeezed", {}, {squeeze});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(squeeze->ooms, 2);
  EXPECT_EQ(r.global_step, 8);
  for (const auto& [key, t] : reference) {
    EXPECT_TRUE(torch::allclose(trained_.at(key), t, 1e-5, 1e-6))
        << key << ": largest difference " << (trained_.at(key) - t).abs().max();
  }
}

// mixed_precision's autocast reaches the ops inside the scripted forward: the logits come out
// in bfloat16 while the parameters stay float32 (the dispatcher's autocast, as in eager
// PyTorch). precision = "bf16" is pinned: "auto" would pick fp32 on a CPU without native bf16.
TEST_F(TorchScript, MixedPrecisionAutocastsTheScriptedForward) {
  auto probe = std::make_shared<OutputDtypes>();
  const RunResult r =
      run(fixture("cnn.pt"), "bf16",
          {"plugins.load=[\"mixed_precision\"]", "plugins.mixed_precision.precision=\"bf16\""}, {probe});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(probe->dtypes.size(), 8u);
  for (const auto d : probe->dtypes) EXPECT_EQ(d, at::kBFloat16);
  for (const auto& [key, t] : trained_) {
    if (t.is_floating_point()) {
      EXPECT_EQ(t.scalar_type(), at::kFloat) << key;
    }
  }
  EXPECT_TRUE(std::isfinite(r.final_metrics.at("train/loss")));
}

// Two ranks (Gloo) and one process whose micro-batches are the ranks' halves train the
// transformer bit for bit alike (the all-reduce adds the halves as the accumulation does).
TEST_F(TorchScript, TwoRanksTrainAsOneProcess) {
  const std::string recipe = tmp_ / "dp.toml";
  write_file(recipe, recipe_for(fixture("transformer.pt")));
  const std::string cli = TRAINER_CLI;
  auto one = run_command(cli + " --recipe " + recipe + " training.micro_batch_size=16 --log-level warn --run-dir " +
                         (tmp_ / "one"));
  ASSERT_EQ(one.code, 0) << one.text;
  auto two =
      run_command(cli + " launch --nproc 2 -- --recipe " + recipe + " --log-level warn --run-dir " + (tmp_ / "two"));
  ASSERT_EQ(two.code, 0) << two.text;
  testing::expect_same_training(tmp_ / "one", tmp_ / "two", 8, "checkpoints/step_00000008.pt");
}

// A run stopped after 4 steps and resumed trains steps 5 to 8 as the run that never stopped:
// the module's parameters come back from the checkpoint into the scripted module, and its
// dropout draws from the resumed random stream.
TEST_F(TorchScript, ResumesExactly) {
  ASSERT_EQ(run(fixture("dropout.pt"), "straight").exit_code, kExitOk);
  const Tensors straight = trained_;
  ASSERT_EQ(run(fixture("dropout.pt"), "part", {"training.max_steps=4"}).exit_code, kExitOk);
  TrainerOptions o = options_for(recipe_for(fixture("dropout.pt")), {}, "resumed");
  o.resume = tmp_ / "part";
  Trainer t(std::move(o));
  const RunResult r = t.fit();
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 8);
  const Tensors resumed = state_of(*t.model());
  for (const auto& [key, v] : straight) EXPECT_TRUE(torch::equal(resumed.at(key), v)) << key;
  const auto a = testing::metric_by_step(tmp_ / "straight/metrics.jsonl", "train/loss");
  const auto b = testing::metric_by_step(tmp_ / "resumed/metrics.jsonl", "train/loss");
  ASSERT_EQ(b.size(), 4u);
  for (const auto& [step, loss] : b) EXPECT_DOUBLE_EQ(loss, a.at(step)) << step;
}

// A TorchScript model or loss is a program, which LibTorch's reader runs: the log says so, naming
// the file (trainer reads every other file it is given as data only).
TEST_F(TorchScript, TheLogSaysTheModelAndTheLossAreCodeThatRuns) {
  TrainerOptions o = options_for(recipe_for(fixture("linear.pt")),
                                 {"training.max_steps=1", "task.loss_path=\"" + fixture("focal.pt") + "\""}, "run");
  o.log_level = "info";
  Trainer t(std::move(o));
  ASSERT_EQ(t.fit().exit_code, kExitOk);
  const std::string log = read_file(tmp_ / "run/trainer.log");
  EXPECT_NE(log.find("model = \"torchscript\": runs the code in " + fixture("linear.pt") +
                     " (a TorchScript model is a program)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("task.loss_path: runs the code in " + fixture("focal.pt") + " (a TorchScript loss is a program)"),
            std::string::npos)
      << log;
}

// docs/models-from-python.md's example: Python scripts docs/examples/torchscript/fashion_cnn.py
// and recipes/torchscript_fashion_mnist.toml trains it (3 steps here), with the built-in cnn's
// parameter count (the same network).
TEST_F(TorchScript, TheDocumentedExampleTrains) {
  const std::string file = tmp_ / "fashion_cnn.pt";
  auto saved = run_command(std::string(TRAINER_TEST_PYTHON) + " " + TRAINER_SOURCE_DIR +
                           "/docs/examples/torchscript/fashion_cnn.py " + file);
  ASSERT_EQ(saved.code, 0) << saved.text;
  auto out =
      run_command(std::string(TRAINER_CLI) + " --recipe " + TRAINER_SOURCE_DIR +
                  "/recipes/torchscript_fashion_mnist.toml 'model.path=\"" + file +
                  "\"' training.max_steps=3 eval.every_epochs=0 eval.at_end=false --run-dir " + (tmp_ / "example"));
  ASSERT_EQ(out.code, 0) << out.text;
  EXPECT_NE(out.text.find("model torchscript: 421738 parameters, 421738 trainable"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("3 steps, status FINISHED"), std::string::npos) << out.text;
}

TEST_F(TorchScript, PluginsThatChangeTheModulesInsidesRefuseIt) {
  RunResult r = run(fixture("transformer.pt"), "gc", {"plugins.load=[\"grad_checkpoint\"]"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("a TorchScript model's forward is compiled as one piece"), std::string::npos) << r.message;
  r = run(fixture("transformer.pt"), "lora",
          {"plugins.load=[\"lora\"]", "plugins.lora.targets=[\"*\"]", "plugins.lora.train_head=false"});
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("LoRA: a TorchScript model's layers are compiled into its forward"), std::string::npos)
      << r.message;
}

}  // namespace
}  // namespace trainer
