// The ema plugin in real runs: the average is the one the formula gives over the weights each
// step left (read back from ema_model.pt), each evaluation evaluates it on the same samples
// (an average that is the weights scores as they do), a resume goes on with the checkpoint's
// average to the same end as an uninterrupted run, and checkpoint.monitor can keep by it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "support/test_util.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using Tensors = std::map<std::string, at::Tensor>;
namespace fs = std::filesystem;

/// The trainable parameters after OptimizerCreated and after each optimizer step.
class WeightLog final : public Plugin {
 public:
  std::string name() const override { return "weight_log"; }
  std::vector<Event> events() const override { return {Event::OptimizerCreated, Event::AfterOptimizerStep}; }
  void on_event(EventContext& ctx, Control&) override {
    Tensors now;
    for (const auto& p : ctx.model->named_parameters()) now[p.key()] = p.value().detach().clone().to(at::kDouble);
    steps.push_back(now);
  }
  std::vector<Tensors> steps;
};

void read_tensors(torch::serialize::InputArchive& archive, const std::string& prefix, Tensors& out) {
  for (const auto& key : archive.keys()) {
    at::Tensor t;
    torch::serialize::InputArchive sub;
    if (archive.try_read(key, t)) {
      out[prefix + key] = t.to(at::kDouble);
    } else if (archive.try_read(key, sub)) {
      read_tensors(sub, prefix + key + ".", out);
    }
  }
}

Tensors model_file(const std::string& file) {
  torch::serialize::InputArchive ar, m;
  ar.load_from(file);
  ar.read("model", m);
  Tensors out;
  read_tensors(m, "", out);
  return out;
}

class Ema : public testing::TrainerTest {
 protected:
  /// kSmallRun (8 SGD steps of 16, an evaluation per epoch) with the ema plugin.
  RunResult fit_with(const std::vector<std::string>& more, const std::string& name,
                     std::vector<std::shared_ptr<Plugin>> extra = {}, const std::string& resume = "") {
    std::vector<std::string> overrides = {"plugins.load=[\"ema\"]", "training.batch_size=16",
                                          "checkpoint.every_steps=1", "checkpoint.keep_last=10"};
    overrides.insert(overrides.end(), more.begin(), more.end());
    TrainerOptions o = options_for(testing::kSmallRun, overrides, name, std::move(extra));
    o.resume = resume;
    return Trainer(std::move(o)).fit();
  }
};

// decay 0.9 without warm-up: avg_0 = w_0, avg_k = 0.9 avg_(k-1) + 0.1 w_k over the 8 steps.
TEST_F(Ema, TheAverageIsTheFormulasOverTheWeightsOfEachStep) {
  auto log = std::make_shared<WeightLog>();
  const RunResult r = fit_with({"+plugins.ema.decay=0.9", "+plugins.ema.warmup=false"}, "run", {log});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(log->steps.size(), 9u);  // the start and 8 steps
  Tensors expected = log->steps[0];
  for (std::size_t k = 1; k < log->steps.size(); ++k) {
    for (auto& [name, avg] : expected) avg = 0.9 * avg + 0.1 * log->steps[k].at(name);
  }
  const Tensors saved = model_file(tmp_ / "run/ema_model.pt");
  for (const auto& [name, avg] : expected) {
    ASSERT_TRUE(saved.count(name)) << name;
    // float32 averages, 8 updates of rounding each.
    EXPECT_LT((saved.at(name) - avg).abs().max().item<double>(), 1e-6) << name;
    EXPECT_GT((saved.at(name) - log->steps.back().at(name)).abs().max().item<double>(), 1e-4)
        << name << ": the average is not the last weights";
  }
  EXPECT_EQ(r.final_metrics.count("eval/ema/accuracy"), 1u);
  EXPECT_EQ(r.final_metrics.count("eval/ema/loss"), 1u);
}

// An average that follows the weights at once (decay near 0) scores what they score, on the same
// samples: evaluate_now() evaluates what the evaluation did.
TEST_F(Ema, AnAverageThatIsTheWeightsScoresAsTheyDo) {
  const RunResult r = fit_with({"+plugins.ema.decay=1e-12", "+plugins.ema.warmup=false"}, "run");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  const auto raw = testing::metric_by_step(tmp_ / "run/metrics.jsonl", "eval/loss");
  const auto ema = testing::metric_by_step(tmp_ / "run/metrics.jsonl", "eval/ema/loss");
  ASSERT_EQ(raw.size(), 2u);
  ASSERT_EQ(ema.size(), raw.size());
  for (const auto& [step, loss] : raw) EXPECT_NEAR(ema.at(step), loss, 1e-6) << step;
  EXPECT_EQ(testing::metric_by_step(tmp_ / "run/metrics.jsonl", "eval/ema/accuracy"),
            testing::metric_by_step(tmp_ / "run/metrics.jsonl", "eval/accuracy"));
}

// Resumed from step 4, the run goes on with the checkpoint's average and ends with the average
// an uninterrupted run ends with; checkpoint.monitor keeps the best by it.
TEST_F(Ema, AResumeGoesOnWithTheCheckpointsAverage) {
  fix_threads();
  ASSERT_EQ(fit_with({}, "full").exit_code, kExitOk);
  ASSERT_EQ(fit_with({"training.max_steps=4"}, "first").exit_code, kExitOk);
  const RunResult resumed = fit_with({"checkpoint.monitor=\"eval/ema/accuracy\"", "checkpoint.mode=\"max\""}, "second",
                                     {}, tmp_ / "first/checkpoints/step_00000004.pt");
  ASSERT_EQ(resumed.exit_code, kExitOk) << resumed.message;
  const Tensors full = model_file(tmp_ / "full/ema_model.pt"), second = model_file(tmp_ / "second/ema_model.pt");
  ASSERT_EQ(full.size(), second.size());
  for (const auto& [name, t] : full) EXPECT_TRUE(torch::equal(t, second.at(name))) << name;
  EXPECT_TRUE(fs::exists(tmp_ / "second/checkpoints/best")) << "kept by eval/ema/accuracy";
}

}  // namespace
}  // namespace trainer
