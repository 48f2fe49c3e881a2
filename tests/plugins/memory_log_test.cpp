// The memory_log plugin (.so) in real runs: the peak window restarts at FitStart, so the
// summary tells what training needed apart from what came before it (building the model,
// loading weights), and a peak during training is not lost.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <regex>

#include "support/test_util.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::json_num;
using testing::json_str;
using testing::read_file;
using testing::read_lines;

constexpr std::int64_t kMiB = 1 << 20;

/// Allocates `bytes` for a moment (written, so the pages are real) at `when`.
class Transient final : public Plugin {
 public:
  Transient(Event when, std::int64_t bytes) : when_(when), bytes_(bytes) {}
  std::string name() const override { return "transient"; }
  std::vector<Event> events() const override { return {when_}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::BatchEnd && ctx.state.global_step != 1) return;
    at::Tensor t = at::empty({bytes_}, at::kByte);
    t.fill_(1);
  }

 private:
  Event when_;
  std::int64_t bytes_;
};

class MemoryLog : public testing::TrainerTest {
 protected:
  struct Summary {
    std::string line;
    double peak_mb = 0, training_mb = 0, above_mb = 0;
  };
  /// Runs kSmallRun with memory_log and `extra`; returns the summary line's figures, and the
  /// memory/peak_mb metric of each logged group in `peaks`.
  Summary run(const std::string& name, const std::vector<std::shared_ptr<Plugin>>& extra, std::vector<double>& peaks) {
    auto o = options_for(testing::kSmallRun, {"plugins.load=[\"memory_log\"]"}, name, extra);
    o.log_level = "info";
    const RunResult r = Trainer(std::move(o)).fit();
    EXPECT_EQ(r.exit_code, 0) << r.message;
    for (const auto& line : read_lines(tmp_ / (name + "/metrics.jsonl"))) {
      if (json_str(line, "name") == "memory/peak_mb") peaks.push_back(*json_num(line, "value"));
    }
    const std::string log = read_file(tmp_ / (name + "/trainer.log"));
    EXPECT_NE(log.find("model mlp: 2410 parameters, 2410 trainable"), std::string::npos) << log;
    EXPECT_NE(log.find("memory at FitStart: "), std::string::npos) << log;
    static const std::regex re(
        R"(memory summary \(cpu\): peak ([0-9.]+) (B|KiB|MiB) allocated, ([0-9.]+) (B|KiB|MiB) while training \(([0-9.]+) (B|KiB|MiB) above its start\), )");
    std::smatch m;
    Summary s;
    if (!std::regex_search(log, m, re)) {
      ADD_FAILURE() << "no memory summary in\n" << log;
      return s;
    }
    const auto mb = [&](int i) {
      const std::string unit = m[i + 1].str();
      return std::stod(m[i].str()) / (unit == "MiB" ? 1.0 : unit == "KiB" ? 1024.0 : kMiB);
    };
    s.line = m[0].str();
    s.peak_mb = mb(1);
    s.training_mb = mb(3);
    s.above_mb = mb(5);
    return s;
  }
};

TEST_F(MemoryLog, APeakBeforeTrainingIsTheRunsButNotTrainings) {
  std::vector<double> peaks;
  const Summary s = run("before", {std::make_shared<Transient>(Event::ModelCreated, 64 * kMiB)}, peaks);
  EXPECT_GE(s.peak_mb, 64.0) << s.line;
  // The small MLP trains in well under a MiB: the 64 MiB before FitStart is not training's.
  EXPECT_LT(s.training_mb, 8.0) << s.line;
  EXPECT_GT(s.above_mb, 0.0) << s.line;            // gradients, activations
  EXPECT_LT(s.above_mb, s.training_mb) << s.line;  // the data and the model were there at the start
  // The metrics: the groups up to FitStart's carry the 64 MiB peak, the later ones do not.
  // Init, ModelToDevice, OptimizerCreated and FitStart are the first four groups.
  ASSERT_GE(peaks.size(), 6u);
  EXPECT_GE(peaks[3], 64.0);
  EXPECT_LT(peaks.back(), 8.0);
}

TEST_F(MemoryLog, APeakDuringTrainingIsTrainings) {
  std::vector<double> peaks;
  const Summary s = run("during", {std::make_shared<Transient>(Event::BatchEnd, 32 * kMiB)}, peaks);
  EXPECT_GE(s.training_mb, 32.0) << s.line;
  EXPECT_GE(s.above_mb, 32.0) << s.line;
  EXPECT_GE(s.peak_mb, s.training_mb) << s.line;
  EXPECT_GE(peaks.back(), 32.0);
}

}  // namespace
}  // namespace trainer
