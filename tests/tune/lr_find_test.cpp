// `trainer lr-find`: the suggestion as Lightning computes it (checked against torch.gradient's
// values), a real sweep that stops when its loss diverges, the run directory it leaves (the
// learning rates in metrics.jsonl, lr_find.json, no checkpoint) and the report's curve.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "lr_find.h"
#include "report.h"
#include "report_chart.h"
#include "support/test_util.h"
#include "trainer/error.h"

namespace trainer::tune {
namespace {

using testing::json_num;
using testing::json_str;
using testing::read_file;
using testing::read_lines;
using testing::TempDir;
using testing::write_file;

namespace fs = std::filesystem;

// A smoothed loss over 30 rates from 1e-4 rising 10^(1/8) a step, falling then rising again:
// torch.gradient(losses[10:-1], spacing=[lrs[10:-1]]) is lowest at index 5 of the slice, so
// Lightning's suggestion is point 15, lr 10^-4 x 10^(15/8) (computed with torch 1.13).
TEST(LrFindSuggestion, IsWhereTheGradientOverTheRatesIsLowestAsInLightning) {
  LrFindResult r;
  for (int i = 0; i < 30; ++i) {
    const double lr = 1e-4 * std::pow(10.0, i / 8.0), x = std::log10(lr);
    const double smoothed = 2.3 - 1.8 / (1 + std::exp(-(x + 1.5) * 3)) + 0.5 * std::exp((x + 0.2) * 4);
    r.points.push_back({i + 1, lr, smoothed, smoothed});
  }
  suggest_lr(r);
  ASSERT_TRUE(r.suggested_lr.has_value()) << r.no_suggestion;
  EXPECT_EQ(r.suggested_index, 15);
  EXPECT_NEAR(*r.suggested_lr, 0.007498942093324559, 1e-15);
  // Non-finite points are left out; too few finite ones give no suggestion, and say why.
  r.points[15].smoothed = std::numeric_limits<double>::quiet_NaN();
  suggest_lr(r);
  ASSERT_TRUE(r.suggested_lr.has_value());
  EXPECT_NE(r.suggested_index, 15);
  r.points.resize(12);
  suggest_lr(r);
  EXPECT_FALSE(r.suggested_lr.has_value());
  EXPECT_NE(r.no_suggestion.find("1 step with a finite loss"), std::string::npos) << r.no_suggestion;
}

class LrFind : public ::testing::Test {
 protected:
  LrFindRequest request(const std::string& name) {
    write_file(tmp_ / "recipe.toml",
               std::string(testing::kSmallRun) + "[sched]\nname = \"cosine\"\nmin_lr_ratio = 0.1\n");
    LrFindRequest r;
    r.recipe = tmp_ / "recipe.toml";
    r.overrides = {"training.batch_size=8", "run.dir=\"" + (tmp_ / "runs") + "\""};
    r.run_dir = tmp_ / name;
    r.log_level = "off";
    return r;
  }
  TempDir tmp_;
};

// SGD from 1e-4 to 1e3 over 60 steps: the loss diverges before the end and the sweep stops
// there; every step's learning rate is min_lr x (max_lr / min_lr)^(i / 59); the run directory
// holds the curve and no checkpoint.
TEST_F(LrFind, ASweepStopsWhenTheLossDivergesAndSuggestsARate) {
  LrFindRequest req = request("sweep");
  req.min_lr = 1e-4;
  req.max_lr = 1e3;
  req.steps = 60;
  const LrFindResult r = find_lr(req);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(r.run_dir, tmp_ / "sweep");
  ASSERT_FALSE(r.stopped.empty()) << "the loss never diverged up to lr 1e3";
  EXPECT_LT(r.points.size(), 60u);
  EXPECT_GT(r.points.size(), 12u);
  ASSERT_TRUE(r.suggested_lr.has_value()) << r.no_suggestion;
  EXPECT_GT(*r.suggested_lr, 1e-4);
  EXPECT_LT(*r.suggested_lr, r.points.back().lr);
  const double gamma = std::pow(1e7, 1.0 / 59.0);
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    EXPECT_EQ(r.points[i].step, static_cast<std::int64_t>(i) + 1);
    EXPECT_NEAR(r.points[i].lr, 1e-4 * std::pow(gamma, double(i)), 1e-12 * r.points[i].lr) << i;
  }
  // metrics.jsonl has each step's learning rate; lr_find.json the sweep; no checkpoint, no
  // evaluation; config.toml says how the run was changed.
  std::vector<double> lrs;
  for (const auto& l : read_lines(tmp_ / "sweep/metrics.jsonl")) {
    if (json_str(l, "name") == "train/lr") lrs.push_back(*json_num(l, "value"));
    EXPECT_NE(json_str(l, "name").rfind("eval/", 0), 0u) << l;
  }
  ASSERT_EQ(lrs.size(), r.points.size());
  EXPECT_DOUBLE_EQ(lrs.front(), 1e-4);
  const std::string saved = read_file(tmp_ / "sweep/lr_find.json");
  EXPECT_NE(saved.find("\"suggested_lr\""), std::string::npos) << saved;
  EXPECT_FALSE(fs::exists(tmp_ / "sweep/checkpoints") && !fs::is_empty(tmp_ / "sweep/checkpoints"));
  const std::string config = read_file(tmp_ / "sweep/config.toml");
  EXPECT_NE(config.find("name = \"exponential\""), std::string::npos) << config;
  EXPECT_EQ(config.find("min_lr_ratio"), std::string::npos) << config;  // the recipe's schedule is replaced

  // The report draws the curve and says the suggestion.
  const report::RunData d = report::read_run(tmp_ / "sweep");
  ASSERT_TRUE(d.lr_find.has_value()) << d.lr_find_error;
  EXPECT_EQ(d.lr_find->points.size(), r.points.size());
  const std::string html = report::render_html(d);
  EXPECT_NE(html.find("Learning-rate finder"), std::string::npos);
  EXPECT_NE(html.find("Suggested learning rate: <b>" + report::format_number(*r.suggested_lr, 3)), std::string::npos);
  EXPECT_NE(html.find("The sweep stopped early"), std::string::npos);
}

// Too few steps for a suggestion: the sweep runs, and says why there is none.
TEST_F(LrFind, ASweepTooShortSaysWhyItSuggestsNothing) {
  LrFindRequest req = request("short");
  req.steps = 5;
  const LrFindResult r = find_lr(req);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(r.points.size(), 5u);
  EXPECT_TRUE(r.stopped.empty()) << r.stopped;  // it ran all its steps
  EXPECT_FALSE(r.suggested_lr.has_value());
  EXPECT_NE(r.no_suggestion.find("more --steps"), std::string::npos) << r.no_suggestion;
  req.min_lr = 1.0;
  req.max_lr = 0.5;
  EXPECT_THROW(find_lr(req), UsageError);
}

// lr_find.json is written through a temporary created new: a link planted at its name (the run
// directory named with --run-dir may hold anything) is replaced, never written through.
TEST_F(LrFind, ALinkAtTheResultsTemporaryIsReplacedNotWrittenThrough) {
  LrFindRequest req = request("planted");
  req.steps = 5;
  write_file(tmp_ / "outside.json", "keep me");
  fs::create_directories(tmp_ / "planted");
  fs::create_symlink(tmp_ / "outside.json", tmp_ / "planted/lr_find.json.tmp");
  const LrFindResult r = find_lr(req);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(read_file(tmp_ / "outside.json"), "keep me");
  EXPECT_FALSE(fs::is_symlink(tmp_ / "planted/lr_find.json"));
  EXPECT_NE(read_file(tmp_ / "planted/lr_find.json").find("\"steps\""), std::string::npos);
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp_ / "planted/lr_find.json.tmp")));
}

// The command: a suggestion and how to use it; the run directory named after the recipe's run.
TEST_F(LrFind, TheCommandPrintsTheSuggestion) {
  const LrFindRequest req = request("unused");
  const std::string out = tmp_ / "out.txt";
  const int status =
      std::system((std::string(TRAINER_CLI) + " lr-find --recipe " + req.recipe + " training.batch_size=8 run.dir='\"" +
                   (tmp_ / "runs") + "\"' --min-lr 1e-4 --max-lr 1e3 --steps 60 --log-level off >" + out + " 2>&1")
                      .c_str());
  const std::string text = read_file(out);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  ASSERT_EQ(WEXITSTATUS(status), 0) << text;
  EXPECT_NE(text.find("suggested learning rate: "), std::string::npos) << text;
  EXPECT_NE(text.find("use it: optim.lr="), std::string::npos) << text;
  ASSERT_TRUE(fs::exists(tmp_ / "runs"));
  const auto dir = fs::directory_iterator(tmp_ / "runs")->path();
  EXPECT_EQ(dir.filename().string().rfind("t-lr-find-", 0), 0u) << dir;
  EXPECT_NE(text.find("trainer report " + dir.string()), std::string::npos) << text;
}

}  // namespace
}  // namespace trainer::tune
