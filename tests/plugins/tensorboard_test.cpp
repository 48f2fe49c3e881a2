// The tensorboard plugin's event files, read back by TensorBoard itself (EventAccumulator from
// the tensorboard package, in a build-directory venv; it checks every record's CRC): the same
// scalars as metrics.jsonl with their steps and wall times, the config as hyper-parameters
// and the end status; a run resumed in place from an earlier checkpoint shows each step once.
// Also the event files' CRC-32C against the standard check value.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "event_file.h"
#include "support/test_util.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using nlohmann::json;
using testing::json_num;
using testing::json_str;
using testing::read_lines;

namespace fs = std::filesystem;

TEST(TensorboardEventFile, Crc32cIsCastagnolis) {
  EXPECT_EQ(tensorboard::crc32c("123456789", 9), 0xE3069283u);  // the check value of CRC-32C
  EXPECT_EQ(tensorboard::crc32c("", 0), 0u);
}

class Tensorboard : public testing::TrainerTest {
 protected:
  /// kSmallRun with the plugin: 4 steps an epoch, 8 in all, a metric line per step.
  RunResult fit_with(const std::vector<std::string>& more, const std::string& name, const std::string& resume = "") {
    std::vector<std::string> overrides = {"plugins.load=[\"tensorboard\"]", "training.batch_size=16",
                                          "checkpoint.every_steps=1", "checkpoint.keep_last=10"};
    overrides.insert(overrides.end(), more.begin(), more.end());
    TrainerOptions o = options_for(testing::kSmallRun, overrides, name);
    o.resume = resume;
    return Trainer(std::move(o)).fit();
  }
  /// What TensorBoard reads from `logdir`.
  static json read_events(const std::string& logdir) {
    const auto out = testing::run_command(std::string(TRAINER_TENSORBOARD_VENV) + "/bin/python " +
                                          TRAINER_TENSORBOARD_READER + " " + logdir);
    EXPECT_EQ(out.code, 0) << out.text;
    const auto start = out.text.rfind("\n{");  // the JSON is the last line
    return json::parse(out.text.substr(start == std::string::npos ? 0 : start + 1));
  }
  /// name's (step, time, value) in metrics.jsonl, in file order.
  static std::vector<std::tuple<long, double, double>> jsonl(const std::string& dir, const std::string& name) {
    std::vector<std::tuple<long, double, double>> out;
    for (const auto& l : read_lines(dir + "/metrics.jsonl")) {
      if (json_str(l, "name") == name) {
        out.emplace_back(static_cast<long>(*json_num(l, "step")), *json_num(l, "time"), *json_num(l, "value"));
      }
    }
    return out;
  }
};

TEST_F(Tensorboard, TensorBoardReadsTheScalarsTheHyperParametersAndTheStatus) {
  const RunResult r = fit_with({}, "run");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  const json tb = read_events(tmp_ / "run/tensorboard");
  for (const std::string name : {"train/loss", "train/lr", "eval/accuracy", "eval/loss"}) {
    const auto expected = jsonl(tmp_ / "run", name);
    ASSERT_FALSE(expected.empty()) << name;
    ASSERT_TRUE(tb["scalars"].contains(name)) << tb.dump();
    const auto& got = tb["scalars"][name];
    ASSERT_EQ(got.size(), expected.size()) << name;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const auto& [step, time, value] = expected[i];
      EXPECT_EQ(got[i][0].get<long>(), step) << name;
      // The wall time is a double in both files; the value a float in TensorBoard's.
      EXPECT_NEAR(got[i][1].get<double>(), time, 1e-6) << name;
      EXPECT_FLOAT_EQ(got[i][2].get<float>(), static_cast<float>(value)) << name;
    }
  }
  ASSERT_FALSE(tb["hparams"].is_null()) << tb.dump();
  EXPECT_EQ(tb["hparams"]["training.batch_size"], 16) << tb["hparams"].dump();
  EXPECT_EQ(tb["hparams"]["optim.name"], "sgd");
  EXPECT_EQ(tb["hparams"]["model.hidden"], "[32]");  // a list, as written in TOML
  EXPECT_EQ(tb["status"], "STATUS_SUCCESS");
}

// Resumed in place from step 4 of 8: the second event file starts at step 4, and TensorBoard
// keeps each step once, the resumed run's values after it.
TEST_F(Tensorboard, ARunResumedInPlaceShowsEachStepOnce) {
  ASSERT_EQ(fit_with({}, "run").exit_code, kExitOk);
  const RunResult resumed = fit_with({}, "run", tmp_ / "run/checkpoints/step_00000004.pt");
  ASSERT_EQ(resumed.exit_code, kExitOk) << resumed.message;
  int files = 0;
  for (const auto& e : fs::directory_iterator(tmp_ / "run/tensorboard"))
    files += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_EQ(files, 2);
  const json tb = read_events(tmp_ / "run/tensorboard");
  std::vector<long> steps;
  for (const auto& p : tb["scalars"]["train/loss"]) steps.push_back(p[0].get<long>());
  EXPECT_EQ(steps, (std::vector<long>{1, 2, 3, 4, 5, 6, 7, 8}));
  const auto last = jsonl(tmp_ / "run", "train/loss").back();
  EXPECT_FLOAT_EQ(tb["scalars"]["train/loss"].back()[2].get<float>(), static_cast<float>(std::get<2>(last)));
}

// A run that fails ends with STATUS_FAILURE in the HParams dashboard.
TEST_F(Tensorboard, AFailedRunEndsWithTheFailureStatus) {
  const RunResult r = fit_with({"training.on_nonfinite=\"stop\"", "optim.lr=1e30"}, "run");
  ASSERT_NE(r.exit_code, kExitOk);
  EXPECT_EQ(read_events(tmp_ / "run/tensorboard")["status"], "STATUS_FAILURE");
}

}  // namespace
}  // namespace trainer
