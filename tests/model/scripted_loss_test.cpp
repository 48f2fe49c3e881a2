// task.loss_path: a loss written in Python and scripted (tests/model/torchscript_models.py
// writes them) in place of the task's own. A focal loss trains as the same Python loop trains
// with it; copies of the built-in losses train as the built-ins; an out-of-memory error inside
// the scripted loss is recovered from; a loss that cannot work exits 2 naming the key and file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "model/torchscript_support.h"
#include "support/test_util.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using namespace ts_test;
using testing::run_command;
using testing::write_file;

std::string loss_path(const std::string& file) { return "task.loss_path=\"" + fixture(file) + "\""; }

class ScriptedLoss : public TorchScript {};

// The cnn and the focal loss, both from Python, trained by trainer and by an eager Python loop
// (the focal loss's Python function, not the scripted one) on the same samples from the same
// weights: the same parameters and losses within float32
// rounding (the tolerances of the model-only comparison, TrainsAsPython, whose reasons hold:
// the same ATen kernels on one thread); a loss misapplied (a mean instead of per-sample
// losses, a sample's loss missed) moves them by ~1e-3.
TEST_F(ScriptedLoss, FocalLossTrainsAsAnEagerPythonLoop) {
  const RunResult r = run(fixture("cnn.pt"), "focal", {loss_path("focal.pt")});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 8);
  const auto model = load(fixture("cnn.pt"));
  load_weights(*model, fixture("cnn_focal_trained.pt"));
  for (const auto& [key, t] : state_of(*model)) {
    ASSERT_TRUE(trained_.count(key)) << key;
    EXPECT_TRUE(torch::allclose(trained_.at(key).to(t.scalar_type()), t, 1e-5, 1e-6))
        << key << ": largest difference " << (trained_.at(key).to(at::kDouble) - t.to(at::kDouble)).abs().max();
  }
  const std::vector<double> python = numbers_in(fixture("cnn_focal_losses.txt"));
  const auto logged = testing::metric_by_step(r.run_dir + "/metrics.jsonl", "train/loss");
  ASSERT_EQ(logged.size(), python.size());
  for (std::size_t i = 0; i < python.size(); ++i) {
    EXPECT_NEAR(logged.at(static_cast<long>(i + 1)), python[i], 1e-5 * std::fabs(python[i])) << "step " << i + 1;
  }
  // The focal loss is not cross-entropy: the cnn's plain reference ends elsewhere.
  const auto plain = load(fixture("cnn.pt"));
  load_weights(*plain, fixture("cnn_trained.pt"));
  EXPECT_FALSE(torch::allclose(trained_.at("head.weight"), state_of(*plain).at("head.weight"), 1e-4, 1e-5));
}

/// An MLP on synthetic data, SGD, one thread: each task's data, its built-in loss against a
/// Python copy of it.
constexpr const char* kMlpRecipe = R"(
[run]
name = "loss"
seed = 5
[model]
name = "mlp"
hidden = [32]
[dataset]
name = "synthetic"
size = 256
eval_size = 64
shape = [12]
num_classes = 10
[training]
epochs = 2
batch_size = 32
log_every = 1
[optim]
name = "sgd"
lr = 0.05
momentum = 0.9
[eval]
every_epochs = 1
[runtime]
num_threads = 1
[metrics]
console = false
)";

struct CopyCase {
  std::string task;
  std::vector<std::string> data;     ///< the task's data
  std::vector<std::string> builtin;  ///< keys of the built-in loss, which the copy has in its file
  std::string file;                  ///< the Python copy of its loss
  std::vector<std::string> metrics;  ///< the task's evaluation metrics, besides eval/loss
};

class CopiesOfTheBuiltIns : public ScriptedLoss, public ::testing::WithParamInterface<CopyCase> {};

// The same ops in the same order (ATen's, called by the interpreter or by the task), so the
// copies train as the built-ins: parameters within 1e-6 relative (classification's built-in
// takes cross-entropy's fused mean, the copy the mean of its per-sample losses, ~1 ulp apart per
// step), the same evaluation metrics, computed from the task's rows with the copy's loss.
TEST_P(CopiesOfTheBuiltIns, TrainAsTheBuiltInLoss) {
  const CopyCase& c = GetParam();
  std::vector<std::string> overrides = c.data;
  overrides.push_back("task.name=\"" + c.task + "\"");
  std::vector<std::string> with_builtin = overrides;
  with_builtin.insert(with_builtin.end(), c.builtin.begin(), c.builtin.end());
  ASSERT_EQ(run_recipe(kMlpRecipe, c.task + "_builtin", with_builtin).exit_code, kExitOk);
  const Tensors builtin = trained_;
  overrides.push_back(loss_path(c.file));
  const RunResult r = run_recipe(kMlpRecipe, c.task + "_copy", overrides);
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 16);
  for (const auto& [key, t] : builtin) {
    EXPECT_TRUE(torch::allclose(trained_.at(key), t, 1e-6, 1e-7))
        << key << ": largest difference " << (trained_.at(key) - t).abs().max();
  }
  for (const std::string& m : c.metrics) {
    const auto a = testing::metric_by_step(tmp_ / (c.task + "_builtin/metrics.jsonl"), "eval/" + m);
    const auto b = testing::metric_by_step(tmp_ / (c.task + "_copy/metrics.jsonl"), "eval/" + m);
    ASSERT_EQ(a.size(), 2u) << m;
    ASSERT_EQ(b.size(), 2u) << m;
    for (const auto& [step, v] : a) EXPECT_NEAR(b.at(step), v, 1e-6 * std::max(1.0, std::fabs(v))) << m << " " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tasks, CopiesOfTheBuiltIns,
    ::testing::Values(CopyCase{"classification", {}, {}, "ce.pt", {"loss", "accuracy", "macro_f1"}},
                      // A buffer of the loss module (its class weights) against task.class_weights.
                      CopyCase{"classification",
                               {},
                               {"task.class_weights=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"},
                               "weighted_ce.pt",
                               {"loss", "accuracy"}},
                      // A float64 model: the loss's buffer follows the outputs' dtype.
                      CopyCase{"classification",
                               {"model.dtype=\"float64\""},
                               {"task.class_weights=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"},
                               "weighted_ce.pt",
                               {"loss", "accuracy"}},
                      CopyCase{"multilabel",
                               {"dataset.targets=\"labels\"", "dataset.num_targets=4"},
                               {},
                               "bce.pt",
                               {"loss", "micro_f1", "map"}},
                      CopyCase{"regression",
                               {"dataset.targets=\"values\"", "dataset.num_targets=3"},
                               {},
                               "mse.pt",
                               {"loss", "rmse", "r2"}}),
    [](const auto& info) {
      return info.param.task + "_" + info.param.file.substr(0, info.param.file.find('.')) +
             (info.param.data.empty() || info.param.data[0].rfind("model.dtype", 0) != 0 ? "" : "_float64");
    });

// The copies above would pass if the file were ignored; twice the built-in loss shows it is
// used: the first step's loss (the initial parameters', before any update) is twice the
// built-in's, to float32 rounding (a doubling is exact; the mean over 32 samples may round
// differently by an ulp).
TEST_F(ScriptedLoss, TheScriptedLossIsTheOneTrainedOn) {
  for (const auto& [task, data, file] : {std::tuple{"multilabel", "dataset.targets=\"labels\"", "double_bce.pt"},
                                         std::tuple{"regression", "dataset.targets=\"values\"", "double_mse.pt"}}) {
    SCOPED_TRACE(task);
    const std::string name = task;
    ASSERT_EQ(run_recipe(kMlpRecipe, name + "_builtin", {"task.name=\"" + name + "\"", data}).exit_code, kExitOk);
    const RunResult r = run_recipe(kMlpRecipe, name + "_double", {"task.name=\"" + name + "\"", data, loss_path(file)});
    ASSERT_EQ(r.exit_code, kExitOk) << r.message;
    const double builtin = testing::metric_by_step(tmp_ / (name + "_builtin/metrics.jsonl"), "train/loss").at(1);
    const double doubled = testing::metric_by_step(tmp_ / (name + "_double/metrics.jsonl"), "train/loss").at(1);
    EXPECT_NEAR(doubled, 2 * builtin, 1e-6 * builtin);
  }
}

// A run's config.toml holds every key with its default filled in (task.class_weights = [] among
// them): run again as a recipe, it is not taken for the built-in loss's keys set beside the file.
TEST_F(ScriptedLoss, ARunsOwnConfigRunsAgain) {
  const RunResult first = run(fixture("linear.pt"), "first", {loss_path("focal.pt"), "training.max_steps=2"});
  ASSERT_EQ(first.exit_code, kExitOk) << first.message;
  const RunResult again = run_recipe(testing::read_file(first.run_dir + "/config.toml"), "again");
  EXPECT_EQ(again.exit_code, kExitOk) << again.message;
}

// Out of memory inside the scripted loss at steps 2 and 5: the budget before the forward leaves
// 1.5 KiB, which the linear model's logits (32 x 10 floats, 1.25 KiB, its one allocation) take,
// so that the loss's first allocation (its log-softmax, as large) is refused inside the
// interpreter. The error is an OOM again (phase "forward", which holds the loss), the core
// retries the batch in halves and the run ends as without the OOMs: halves of a linear model
// compute the same gradient, summed in two parts (1e-5 relative, as the model-only OOM test).
TEST_F(ScriptedLoss, RecoversFromOutOfMemoryInsideTheLoss) {
  ASSERT_EQ(run(fixture("linear.pt"), "clean", {loss_path("focal.pt")}).exit_code, kExitOk);
  const Tensors reference = trained_;
  auto squeeze = std::make_shared<Squeeze>(std::set<std::int64_t>{1, 4}, 1536);
  const RunResult r = run(fixture("linear.pt"), "squeezed", {loss_path("focal.pt")}, {squeeze});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(squeeze->ooms, 2);
  for (const OomPhase p : squeeze->phases) EXPECT_EQ(p, OomPhase::Forward);
  for (const std::string& m : squeeze->messages) {
    EXPECT_NE(m.find("out of memory"), std::string::npos) << m;
    EXPECT_NE(m.find("focal"), std::string::npos) << m;  // the TorchScript traceback names the function
  }
  EXPECT_EQ(r.global_step, 8);
  for (const auto& [key, t] : reference) {
    EXPECT_TRUE(torch::allclose(trained_.at(key), t, 1e-5, 1e-6))
        << key << ": largest difference " << (trained_.at(key) - t).abs().max();
  }
}

struct BadLoss {
  std::string file;
  std::vector<std::string> overrides;
  std::string says;
};

TEST_F(ScriptedLoss, LossesThatCannotWorkExitTwoNamingTheKeyAndFile) {
  const std::vector<BadLoss> cases = {
      {"missing.pt", {}, "no such file; save the loss in Python with torch.jit.script(loss).save(path)"},
      {"not_a_zip.pt", {}, "not a TorchScript module file (it is not a zip archive"},
      {"state_dict.pt", {}, "a torch.save file (a pickled object such as a state_dict), not a TorchScript module"},
      {"cnn.pt",
       {},
       "forward must take two Tensors (the model's outputs and the targets; further arguments need defaults) and "
       "return one Tensor (each sample's loss); it is `forward("},
      {"mean_ce.pt", {}, "returned [] (Float); it must return each sample's loss, floating point [8]"},
      {"error_rate.pt", {}, "the loss has no gradient with respect to the outputs"},
      {"learned.pt", {}, "the loss has parameters (temperature), which nothing would train"},
      {"bce.pt", {}, "the loss failed on outputs [8, 10] (Float) and targets [8] (Long)"},
      {"in_place.pt", {}, "the loss changed its outputs argument in place"},
      {"focal.pt", {"task.label_smoothing=0.1"}, "task.label_smoothing shapes the task's own loss"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const BadLoss& c = cases[i];
    SCOPED_TRACE(c.file);
    std::vector<std::string> overrides = c.overrides;
    overrides.push_back(loss_path(c.file));
    const RunResult r = run(fixture("cnn.pt"), "bad" + std::to_string(i), overrides);
    EXPECT_EQ(r.exit_code, kExitUsage) << r.message;
    if (c.overrides.empty()) {
      EXPECT_NE(r.message.find("task.loss_path = \"" + fixture(c.file) + "\""), std::string::npos) << r.message;
    }
    EXPECT_NE(r.message.find(c.says), std::string::npos) << r.message;
  }
  // Regression's own loss keys beside a scripted loss.
  const RunResult huber = run_recipe(
      kMlpRecipe, "huber",
      {"task.name=\"regression\"", "dataset.targets=\"values\"", "task.loss=\"huber\"", loss_path("mse.pt")});
  EXPECT_EQ(huber.exit_code, kExitUsage);
  EXPECT_NE(huber.message.find("task.loss shapes the task's own loss, which task.loss_path"), std::string::npos)
      << huber.message;
  const RunResult pos_weight = run_recipe(kMlpRecipe, "pos_weight",
                                          {"task.name=\"multilabel\"", "dataset.targets=\"labels\"",
                                           "dataset.num_targets=2", "task.pos_weight=[1, 3]", loss_path("bce.pt")});
  EXPECT_EQ(pos_weight.exit_code, kExitUsage);
  EXPECT_NE(pos_weight.message.find("task.pos_weight shapes the task's own loss"), std::string::npos)
      << pos_weight.message;
  // From the command line: exit status 2 and the message on the terminal.
  write_file(tmp_ / "bad.toml", recipe_for(fixture("cnn.pt")));
  const auto out = run_command(std::string(TRAINER_CLI) + " --recipe " + (tmp_ / "bad.toml") + " '" +
                               loss_path("mean_ce.pt") + "' --run-dir " + (tmp_ / "cli"));
  EXPECT_EQ(out.code, kExitUsage) << out.text;
  EXPECT_NE(out.text.find("mean_ce.pt\": the loss of outputs [8, 10] returned []"), std::string::npos) << out.text;
}

}  // namespace
}  // namespace trainer
