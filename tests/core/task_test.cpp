// Tasks: what a run learns. The built-in tasks' metrics on inputs with known answers (the
// examples of scikit-learn's documentation), runs of each task, evaluation metrics that count
// every sample once through out-of-memory retries and across ranks, data that does not fit a
// task refused with exit code 2, and a task a plugin (.so) registers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <regex>

#include "dist/dp_util.h"
#include "support/test_util.h"
#include "trainer/memory.h"
#include "trainer/task.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::metric_by_step;
using testing::read_file;
using testing::run_command;
using testing::write_file;

const c10::Device kCpu(c10::kCPU);

/// The task `name` with [task] keys `keys` for targets like `targets` and `classes` classes.
std::unique_ptr<Task> task_for(const std::string& name, const at::Tensor& targets, std::int64_t classes = 0,
                               const std::string& keys = "") {
  const Config c = Config::parse("[task]\nname = \"" + name + "\"\n" + keys);
  return task_registry().get(name).factory(c.sub("task"), DataSpec{{4}, classes}, Batch{at::zeros({1}), targets});
}

/// The task's evaluation metrics of `outputs` against `targets`, as the core computes them.
std::map<std::string, double> evaluate(const Task& task, const at::Tensor& outputs, const at::Tensor& targets) {
  const at::Tensor rows = task.eval_rows(outputs, targets);
  EXPECT_EQ(rows.size(1), task.eval_width());
  return task.evaluate(rows);
}

TEST(Tasks, ClassificationMetricsMatchScikitLearnsExamples) {
  // f1_score(y_true, y_pred, average="macro") of scikit-learn's documentation: 0.2666...
  const at::Tensor targets = at::tensor({0, 1, 2, 0, 1, 2}, at::kLong);
  const at::Tensor predicted = at::tensor({0, 2, 1, 0, 0, 1}, at::kLong);
  const auto task = task_for("classification", targets, 3, "top_k = 2\n");
  EXPECT_EQ(task->outputs(), 3);
  // Logits whose largest is the prediction and second largest the next class.
  at::Tensor logits = at::zeros({6, 3});
  for (std::int64_t i = 0; i < 6; ++i) {
    logits[i][predicted[i].item<std::int64_t>()] = 2.0;
    logits[i][(predicted[i].item<std::int64_t>() + 1) % 3] = 1.0;
  }
  const auto m = evaluate(*task, logits, targets);
  EXPECT_NEAR(m.at("accuracy"), 2.0 / 6.0, 1e-12);
  EXPECT_NEAR(m.at("macro_f1"), 0.26666666666666666, 1e-12);
  // top-2: samples 1 (1 -> 2, then 0) miss; 2 (2 -> 1, then 2) hit; 4 (1 -> 0, then 1) hit; 5 (2 -> 1, 2) hit.
  EXPECT_NEAR(m.at("top2_accuracy"), 5.0 / 6.0, 1e-12);
  EXPECT_NEAR(task->train_metrics(task->train_sums(logits, targets), 6).at("accuracy"), 2.0 / 6.0, 1e-12);
  // The loss column is cross-entropy per sample.
  const at::Tensor ce = at::cross_entropy_loss(logits, targets, {}, at::Reduction::None);
  EXPECT_TRUE(torch::allclose(task->eval_rows(logits, targets).select(1, 0), ce.to(at::kDouble)));
}

TEST(Tasks, ClassWeightsScaleEachSamplesLossAndLabelSmoothingIsCrossEntropys) {
  const at::Tensor targets = at::tensor({0, 1, 1}, at::kLong);
  const at::Tensor logits = at::tensor({0.5, -1.0, 2.0, 0.0, 1.0, 1.5}).reshape({3, 2});
  const auto weighted = task_for("classification", targets, 2, "class_weights = [2.0, 0.5]\nlabel_smoothing = 0.1\n");
  const at::Tensor plain =
      at::cross_entropy_loss(logits, targets, at::tensor({2.0, 0.5}), at::Reduction::None, -100, 0.1);
  EXPECT_TRUE(torch::allclose(weighted->sample_losses(logits, targets), plain));
  // What the step trains on is the mean over samples, fused or not (float32 sums: 1e-6).
  EXPECT_TRUE(torch::allclose(weighted->mean_loss(logits, targets), plain.mean(), 1e-6, 1e-7));
  const auto unweighted = task_for("classification", targets, 2, "label_smoothing = 0.1\n");
  EXPECT_TRUE(torch::allclose(unweighted->mean_loss(logits, targets), unweighted->sample_losses(logits, targets).mean(),
                              1e-6, 1e-7));
}

TEST(Tasks, MultilabelMetricsCountedByHandAndScikitLearnsAveragePrecision) {
  // average_precision_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) of scikit-learn's documentation.
  const at::Tensor t1 = at::tensor({0.f, 0.f, 1.f, 1.f}).reshape({4, 1});
  const auto one = task_for("multilabel", t1);
  EXPECT_NEAR(evaluate(*one, at::tensor({0.1f, 0.4f, 0.35f, 0.8f}).reshape({4, 1}), t1).at("map"), 0.8333333333333333,
              1e-7);
  // Tied scores are one threshold: 0.5 (one positive, one negative), then 0.2 (a positive):
  // 0.5 x 0.5 + 0.5 x 2/3.
  const at::Tensor t2 = at::tensor({1.f, 0.f, 1.f}).reshape({3, 1});
  EXPECT_NEAR(evaluate(*one, at::tensor({0.5f, 0.5f, 0.2f}).reshape({3, 1}), t2).at("map"), 0.25 + 1.0 / 3.0, 1e-12);

  // Two labels: label 0 is in samples 0 and 2 and predicted for samples 0 and 3: tp 1, fp 1,
  // fn 1, F1 0.5, AP 0.75; label 1 is in samples 1 and 2, predicted for both: F1 1, AP 1.
  const at::Tensor targets = at::tensor({1.f, 0.f, 0.f, 1.f, 1.f, 1.f, 0.f, 0.f}).reshape({4, 2});
  const at::Tensor logits = at::tensor({2.f, -1.f, -1.f, 3.f, -2.f, 1.f, 1.f, -3.f}).reshape({4, 2});
  const auto two = task_for("multilabel", targets);
  EXPECT_EQ(two->outputs(), 2);
  const auto m = evaluate(*two, logits, targets);
  EXPECT_NEAR(m.at("micro_f1"), 0.75, 1e-12);
  EXPECT_NEAR(m.at("macro_f1"), 0.75, 1e-12);
  EXPECT_NEAR(m.at("map"), 0.875, 1e-12);
  EXPECT_NEAR(two->train_metrics(two->train_sums(logits, targets), 4).at("micro_f1"), 0.75, 1e-12);
  // A third label that no sample has and none is predicted: its F1 is 0 in the macro average
  // (scikit-learn's zero_division = 0 for indicator targets); mAP leaves it out (it has no
  // positive sample; scikit-learn would count it as 0, with a warning).
  const at::Tensor t3 = at::cat({targets, at::zeros({4, 1})}, 1);
  const at::Tensor l3 = at::cat({logits, at::full({4, 1}, -5.0f)}, 1);
  const auto m3 = evaluate(*task_for("multilabel", t3), l3, t3);
  EXPECT_NEAR(m3.at("macro_f1"), 0.5, 1e-12);
  EXPECT_NEAR(m3.at("micro_f1"), 0.75, 1e-12);
  EXPECT_NEAR(m3.at("map"), 0.875, 1e-12);
  // threshold 0.9 (a logit above 2.197): only sample 1's label 1 is predicted.
  const auto strict = task_for("multilabel", targets, 0, "threshold = 0.9\n");
  EXPECT_NEAR(evaluate(*strict, logits, targets).at("micro_f1"), 2.0 / (2.0 + 0 + 3), 1e-12);
}

TEST(Tasks, RegressionMetricsMatchScikitLearnsExamples) {
  // r2_score([3, -0.5, 2, 7], [2.5, 0.0, 2, 8]) = 0.948..., MAE 0.5, MSE 0.375.
  const at::Tensor y = at::tensor({3.0, -0.5, 2.0, 7.0}, at::kDouble);
  const auto task = task_for("regression", y);
  EXPECT_EQ(task->outputs(), 1);
  const auto m = evaluate(*task, at::tensor({2.5, 0.0, 2.0, 8.0}, at::kDouble).reshape({4, 1}), y);
  EXPECT_NEAR(m.at("r2"), 1.0 - 1.5 / 29.1875, 1e-12);
  EXPECT_NEAR(m.at("mae"), 0.5, 1e-12);
  EXPECT_NEAR(m.at("rmse"), std::sqrt(0.375), 1e-12);
  // Two targets: r2_score(..., multioutput="uniform_average") of the documentation's example.
  const at::Tensor y2 = at::tensor({0.5, 1.0, -1.0, 1.0, 7.0, -6.0}, at::kDouble).reshape({3, 2});
  const at::Tensor p2 = at::tensor({0.0, 2.0, -1.0, 2.0, 8.0, -5.0}, at::kDouble).reshape({3, 2});
  const auto multi = task_for("regression", y2);
  EXPECT_EQ(multi->outputs(), 2);
  const auto m2 = evaluate(*multi, p2, y2);
  EXPECT_NEAR(m2.at("r2"), 0.9368005266622779, 1e-12);
  EXPECT_NEAR(m2.at("mae"), 0.75, 1e-12);
  // root_mean_squared_error(..., multioutput="uniform_average"): the mean of each target's RMSE.
  EXPECT_NEAR(m2.at("rmse"), (std::sqrt(1.25 / 3.0) + 1.0) / 2.0, 1e-12);
  // The losses: mean over the targets of squared, absolute or Huber errors.
  const auto l1 = task_for("regression", y2, 0, "loss = \"l1\"\n");
  EXPECT_TRUE(torch::allclose(l1->sample_losses(p2, y2), at::tensor({0.75, 0.5, 1.0}, at::kDouble)));
  const auto huber = task_for("regression", y2, 0, "loss = \"huber\"\nhuber_delta = 0.5\n");
  // |e| = 0.5, 1 | 0, 1 | 1, 1: Huber(0.5) is 0.125 at 0.5 and 0.375 at 1.
  EXPECT_TRUE(torch::allclose(huber->sample_losses(p2, y2), at::tensor({0.25, 0.1875, 0.375}, at::kDouble)));
}

constexpr const char* kRecipe = R"(
[run]
name = "task"
seed = 3
[model]
name = "mlp"
hidden = [64]
[dataset]
name = "synthetic"
size = 512
eval_size = 200
shape = [16]
num_classes = 5
[training]
epochs = 6
batch_size = 32
log_every = 4
[optim]
name = "adamw"
lr = 0.01
[eval]
every_epochs = 1
batch_size = 64
[runtime]
num_threads = 1
[metrics]
console = false
)";

/// Makes the evaluation run out of memory at its `at`-th batch, once (a real refused
/// allocation), and asks for a retry at the same size: the same batches again.
class EvalSqueeze final : public Plugin {
 public:
  explicit EvalSqueeze(int at) : at_(at) {}
  std::string name() const override { return "eval_squeeze"; }
  std::vector<Event> events() const override { return {Event::EvalBatchStart, Event::OutOfMemory}; }
  int default_priority() const override { return -100; }
  void on_event(EventContext& ctx, Control& c) override {
    if (ctx.event == Event::OutOfMemory) {
      set_memory_limit(kCpu, 0);
      ++ooms;
      c.retry_with_micro_batch = ctx.oom->micro_batch_size;
      return;
    }
    if (++seen_ == at_ && ooms == 0) set_memory_limit(kCpu, memory_stats(kCpu).allocated + 1024);
  }
  int ooms = 0;

 private:
  int at_;
  int seen_ = 0;
};

class TaskRuns : public testing::TrainerTest {
 protected:
  void TearDown() override { set_memory_limit(kCpu, 0); }
  RunResult run(const std::string& name, const std::vector<std::string>& overrides,
                const std::vector<std::shared_ptr<Plugin>>& extra = {}) {
    return fit(kRecipe, overrides, name, extra);
  }
  /// The metric at the run's last evaluation.
  double last(const std::string& run, const std::string& metric) {
    const auto m = metric_by_step(tmp_ / (run + "/metrics.jsonl"), metric);
    EXPECT_FALSE(m.empty()) << run << " logged no " << metric;
    return m.empty() ? std::nan("") : m.rbegin()->second;
  }
  double first(const std::string& run, const std::string& metric) {
    const auto m = metric_by_step(tmp_ / (run + "/metrics.jsonl"), metric);
    return m.empty() ? std::nan("") : m.begin()->second;
  }
};

// The synthetic targets are a fixed projection of the inputs: an MLP learns them.
TEST_F(TaskRuns, RegressionLearnsRealValuedTargets) {
  const RunResult r =
      run("regression", {"task.name=\"regression\"", "dataset.targets=\"values\"", "dataset.num_targets=3"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_GT(last("regression", "eval/r2"), 0.9);
  EXPECT_LT(last("regression", "eval/rmse"), first("regression", "eval/rmse") / 2);
  EXPECT_GT(last("regression", "train/mae"), 0.0);
  EXPECT_GT(last("regression", "train/rmse"), 0.0);
  EXPECT_TRUE(metric_by_step(tmp_ / "regression/metrics.jsonl", "train/accuracy").empty());
  EXPECT_TRUE(metric_by_step(tmp_ / "regression/metrics.jsonl", "eval/accuracy").empty());
}

TEST_F(TaskRuns, MultilabelLearnsZeroOneLabels) {
  const RunResult r = run("multilabel", {"task.name=\"multilabel\"", "dataset.targets=\"labels\""});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_GT(last("multilabel", "eval/micro_f1"), 0.85);
  EXPECT_GT(last("multilabel", "eval/macro_f1"), 0.85);
  EXPECT_GT(last("multilabel", "eval/map"), 0.9);
  EXPECT_GT(last("multilabel", "train/micro_f1"), 0.0);
}

TEST_F(TaskRuns, ClassificationLogsTopKAndMacroF1AndItsKeysChangeTheLoss) {
  ASSERT_EQ(run("plain", {"training.epochs=1", "task.top_k=2"}).exit_code, kExitOk);
  for (const char* m : {"eval/accuracy", "eval/top2_accuracy", "eval/macro_f1", "eval/loss", "train/accuracy"}) {
    EXPECT_FALSE(metric_by_step(tmp_ / "plain/metrics.jsonl", m).empty()) << m;
  }
  EXPECT_TRUE(metric_by_step(tmp_ / "plain/metrics.jsonl", "eval/top5_accuracy").empty());
  // The default top_k = 5 of 5 classes: always 1, not logged.
  ASSERT_EQ(run("default", {"training.epochs=1"}).exit_code, kExitOk);
  EXPECT_TRUE(metric_by_step(tmp_ / "default/metrics.jsonl", "eval/top5_accuracy").empty());
  ASSERT_EQ(run("weighted", {"training.epochs=1", "task.class_weights=[1.0, 2.0, 1.0, 1.0, 3.0]",
                             "task.label_smoothing=0.1", "task.top_k=2"})
                .exit_code,
            kExitOk);
  EXPECT_NE(last("weighted", "train/loss"), last("plain", "train/loss"));
}

// Evaluation out of memory at its third batch: the retry rewrites the rows of the samples it
// evaluates again, and the metrics are exactly those of the evaluation that did not fail (the
// same batches: the same sums).
TEST_F(TaskRuns, AnEvaluationRetriedAfterAnOutOfMemoryErrorCountsEverySampleOnce) {
  for (const std::string task : {"regression", "multilabel", "classification"}) {
    SCOPED_TRACE(task);
    const std::vector<std::string> o = {"task.name=\"" + task + "\"",
                                        std::string("dataset.targets=\"") +
                                            (task == "regression"   ? "values"
                                             : task == "multilabel" ? "labels"
                                                                    : "classes") +
                                            "\"",
                                        "training.epochs=1"};
    ASSERT_EQ(run(task + "_clean", o).exit_code, kExitOk);
    auto squeeze = std::make_shared<EvalSqueeze>(3);
    const RunResult r = run(task + "_oom", o, {squeeze});
    ASSERT_EQ(r.exit_code, kExitOk) << r.message;
    EXPECT_EQ(squeeze->ooms, 1);
    const auto clean = metric_by_step(tmp_ / (task + "_clean/metrics.jsonl"), "eval/loss");
    const auto retried = metric_by_step(tmp_ / (task + "_oom/metrics.jsonl"), "eval/loss");
    EXPECT_EQ(retried, clean);
    for (const auto& [name, value] : r.final_metrics) {
      if (name.rfind("eval/", 0) == 0) {
        EXPECT_EQ(value, last(task + "_clean", name)) << name;
      }
    }
  }
}

// Two ranks evaluate half of the samples each with the same batch size; the rows they write
// are added up: the metrics of one process evaluating all of them, up to the kernels' sums
// over batches of other compositions (1e-6 relative: a sample's float32 outputs differ by
// ~1e-7 between batch shapes, and the metrics measured here moved by at most 2e-8; a sample
// lost or counted twice moves a mean over 200 samples by ~5e-3).
TEST_F(TaskRuns, TwoRanksEvaluateAsOneProcess) {
  const std::string recipe = tmp_ / "dp.toml";
  write_file(recipe, std::string(kRecipe) + "[task]\nname = \"regression\"\n");
  const std::string cli = std::string(TRAINER_CLI) + " --recipe " + recipe +
                          " dataset.targets='\"values\"' training.epochs=2 training.micro_batch_size=16";
  auto one = run_command(cli + " --log-level warn --run-dir " + (tmp_ / "one"));
  ASSERT_EQ(one.code, 0) << one.text;
  auto two =
      run_command(std::string(TRAINER_CLI) + " launch --nproc 2 -- --recipe " + recipe +
                  " dataset.targets='\"values\"' training.epochs=2 --log-level warn --run-dir " + (tmp_ / "two"));
  ASSERT_EQ(two.code, 0) << two.text;
  for (const char* m : {"eval/loss", "eval/mae", "eval/rmse", "eval/r2", "train/mae", "train/rmse"}) {
    const auto a = metric_by_step(tmp_ / "one/metrics.jsonl", m), b = metric_by_step(tmp_ / "two/metrics.jsonl", m);
    ASSERT_EQ(a.size(), b.size()) << m;
    ASSERT_FALSE(a.empty()) << m;
    for (const auto& [step, v] : a) EXPECT_NEAR(b.at(step), v, 1e-6 * std::fabs(v)) << m << " at step " << step;
  }
}

struct Refusal {
  std::vector<std::string> overrides;
  std::string says;
};

TEST_F(TaskRuns, DataThatDoesNotFitTheTaskExitsTwoSayingWhatIsAllowed) {
  const std::vector<Refusal> cases = {
      {{"dataset.targets=\"values\""},
       "task.name = \"classification\": the dataset's targets are Float of shape [8] (per batch); classification "
       "needs integer class indices (int64); for real-valued targets use task.name = \"regression\""},
      {{"dataset.targets=\"labels\""},
       "classification needs integer class indices (int64); for real-valued targets use task.name = \"regression\", "
       "for 0/1 labels per class \"multilabel\""},
      {{"task.name=\"multilabel\""},
       "task.name = \"multilabel\": the dataset's targets are Long of shape [8] (per batch); multilabel needs a row "
       "of 0/1 labels per sample ([N, labels])"},
      {{"task.name=\"multilabel\"", "dataset.targets=\"values\"", "dataset.num_targets=5"},
       "with values other than 0 and 1; multilabel targets are 0 (absent) or 1 (present)"},
      {{"task.class_weights=[1.0, 2.0]"}, "task.class_weights has 2 values; the dataset has 5 classes"},
      {{"task.name=\"ranking\""}, "task.name = \"ranking\": must be string, one of: classification"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].says);
    const RunResult r = run("bad" + std::to_string(i), cases[i].overrides);
    EXPECT_EQ(r.exit_code, kExitUsage) << r.message;
    EXPECT_NE(r.message.find(cases[i].says), std::string::npos) << r.message;
  }
  // From the command line: exit status 2, the allowed names listed.
  write_file(tmp_ / "r.toml", kRecipe);
  const auto out = run_command(std::string(TRAINER_CLI) + " --recipe " + (tmp_ / "r.toml") +
                               " task.name='\"ranking\"' --run-dir " + (tmp_ / "cli"));
  EXPECT_EQ(out.code, kExitUsage) << out.text;
  EXPECT_NE(out.text.find("classification"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("multilabel"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("regression"), std::string::npos) << out.text;
}

// A plugin (.so) registers the task "hinge" with its key when it is loaded; a recipe names it
// and its metrics are logged.
TEST_F(TaskRuns, APluginRegistersATask) {
  const RunResult r =
      run("hinge", {"plugins.load=[\"custom_task\"]", "task.name=\"hinge\"", "task.margin=0.5", "training.epochs=2"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_GT(last("hinge", "eval/hinge_accuracy"), 0.0);
  EXPECT_FALSE(metric_by_step(tmp_ / "hinge/metrics.jsonl", "eval/mean_margin").empty());
  EXPECT_FALSE(metric_by_step(tmp_ / "hinge/metrics.jsonl", "train/hinge_accuracy").empty());
  EXPECT_LT(last("hinge", "train/loss"), first("hinge", "train/loss"));
  // Its key is validated as the core's are.
  const RunResult bad = run("bad_margin", {"plugins.load=[\"custom_task\"]", "task.name=\"hinge\"", "task.margin=0"});
  EXPECT_EQ(bad.exit_code, kExitUsage);
  EXPECT_NE(bad.message.find("task.margin"), std::string::npos) << bad.message;
}

}  // namespace
}  // namespace trainer
