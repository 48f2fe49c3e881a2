// `trainer bench`: the grid's parsing, every cell of a grid run or marked, predicted
// out-of-memory cells not run, a real out-of-memory error reported, the CSV and Markdown files.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <sstream>

#include "bench_suite.h"
#include "support/test_util.h"
#include "trainer/error.h"

namespace {

using trainer::testing::TempDir;
using trainer::tune::parse_grid;

const std::string kBenchTight = std::string(TRAINER_SOURCE_DIR) + "/recipes/fashion_mnist_tight.toml";

TEST(BenchGrid, ParsesAxesAndValuesWithBracketsAndQuotes) {
  const auto g = parse_grid(R"(training.micro_batch_size=32,64  model=mlp,cnn plugins.load=["a","b"],[])");
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].key, "training.micro_batch_size");
  EXPECT_EQ(g[0].values, (std::vector<std::string>{"32", "64"}));
  EXPECT_EQ(g[1].values, (std::vector<std::string>{"mlp", "cnn"}));
  EXPECT_EQ(g[2].values, (std::vector<std::string>{R"(["a","b"])", "[]"}));
  const auto cells = trainer::tune::grid_cells(g);
  ASSERT_EQ(cells.size(), 8u);
  EXPECT_EQ(cells[0],
            (std::vector<std::string>{"training.micro_batch_size=32", "model=mlp", R"(plugins.load=["a","b"])"}));
  EXPECT_EQ(cells[7], (std::vector<std::string>{"training.micro_batch_size=64", "model=cnn", "plugins.load=[]"}));
}

TEST(BenchGrid, BadGridsAreUsageErrorsNamingThePart) {
  const auto message = [](const std::string& grid) {
    try {
      parse_grid(grid);
    } catch (const trainer::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("model").find("'model' is not key=v1,v2"), std::string::npos);
  EXPECT_NE(message("model=").find("'model=' is not key=v1,v2"), std::string::npos);
  EXPECT_NE(message("model=mlp,,cnn").find("has an empty value"), std::string::npos);
  EXPECT_NE(message("a=1 a=2").find("names 'a' twice"), std::string::npos);
  EXPECT_NE(message("a=[1,2").find("unbalanced"), std::string::npos);
  EXPECT_NE(message("  ").find("--grid is empty"), std::string::npos);
}

TEST(Bench, EveryCellIsRunOrMarkedAndPredictedOutOfMemoryCellsAreNotRun) {
  TempDir tmp;
  trainer::tune::BenchRequest req;
  req.recipe = kBenchTight;  // 100 MiB budget, oom_backoff
  req.overrides = {"training.micro_batch_size=0"};
  req.grid = parse_grid("model=mlp,cnn training.batch_size=32,512");
  req.steps = 3;
  req.warmup = 1;
  req.work_dir = tmp.str();
  std::ostringstream progress;
  const auto r = trainer::tune::run_bench(req, progress);
  ASSERT_EQ(r.cells.size(), 4u);
  EXPECT_EQ(r.device, "cpu");
  for (std::size_t i : {0, 1, 2}) {
    const auto& c = r.cells[i];
    EXPECT_EQ(c.status, trainer::tune::CellStatus::Ok) << i << ": " << c.message;
    EXPECT_EQ(c.measured_steps, 3);
    EXPECT_GT(c.samples_per_s, 0);
    EXPECT_LE(c.step_ms_min, c.step_ms_median);
    EXPECT_LE(c.step_ms_median, c.step_ms_max);
    EXPECT_GT(c.peak, 0);
    EXPECT_LE(c.peak, 100 * 1024 * 1024);  // inside the budget the cell ran under
    EXPECT_GT(c.predicted_peak, 0);
    EXPECT_FALSE(c.out_of_memory);
  }
  // The CNN at batch 512 needs about 294 MiB: predicted, marked, not run.
  EXPECT_EQ(r.cells[3].status, trainer::tune::CellStatus::PredictedOom);
  EXPECT_EQ(r.cells[3].measured_steps, 0);
  EXPECT_NE(r.cells[3].message.find("usable (memory.limit_mb = 100)"), std::string::npos) << r.cells[3].message;
  EXPECT_NE(progress.str().find("cell 4/4: model=cnn training.batch_size=512 -> predicted_oom"), std::string::npos)
      << progress.str();
  EXPECT_TRUE(std::filesystem::is_empty(tmp.str()));  // the cells' run directories are gone

  std::ostringstream csv, md;
  trainer::tune::write_bench_csv(r, csv);
  const auto lines = trainer::testing::read_lines_of(csv.str());
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0].rfind("model,training.batch_size,status,micro_batch_used,samples_per_s", 0), 0u) << lines[0];
  EXPECT_EQ(lines[4].rfind("cnn,512,predicted_oom,512,,,,,", 0), 0u) << lines[4];
  trainer::tune::write_bench_markdown(r, md);
  EXPECT_EQ(trainer::testing::read_lines_of(md.str()).size(), 6u);
}

TEST(Bench, WithoutTheEstimateAnOutOfMemoryCellRunsAndSaysSo) {
  TempDir tmp;
  trainer::tune::BenchRequest req;
  req.recipe = kBenchTight;
  req.overrides = {"model=cnn", "model.memory_format=contiguous", "training.micro_batch_size=0",
                   "plugins.oom_backoff.min_micro_batch=8"};
  req.grid = parse_grid("training.batch_size=256 plugins.load=[\"oom_backoff\"],[]");
  req.steps = 2;
  req.warmup = 1;
  req.estimate = false;
  req.work_dir = tmp.str();
  std::ostringstream progress;
  const auto r = trainer::tune::run_bench(req, progress);
  ASSERT_EQ(r.cells.size(), 2u);
  // With oom_backoff: recovered at a smaller micro-batch, measured, marked.
  EXPECT_EQ(r.cells[0].status, trainer::tune::CellStatus::Ok) << r.cells[0].message;
  EXPECT_TRUE(r.cells[0].out_of_memory);
  EXPECT_LT(r.cells[0].micro_batch_used, 256);
  EXPECT_NE(r.cells[0].message.find("ran out of memory at micro-batch 256"), std::string::npos);
  EXPECT_EQ(r.cells[0].predicted_peak, -1);
  // Without: the run fails with the out-of-memory error.
  EXPECT_EQ(r.cells[1].status, trainer::tune::CellStatus::Oom);
  EXPECT_TRUE(r.cells[1].out_of_memory);
  EXPECT_NE(r.cells[1].message.find("out of memory"), std::string::npos);
}

trainer::testing::CommandOutput bench_cli(const std::string& args) {
  return trainer::testing::run_command(std::string(TRAINER_CLI) + " " + args);
}

TEST(BenchCli, WritesTheTableCsvAndMarkdown) {
  TempDir tmp;
  const auto o = bench_cli("bench --recipe " + kBenchTight +
                           " --grid 'training.micro_batch_size=16,32' --steps 2 --warmup 1 "
                           "--csv " +
                           (tmp / "out.csv") + " --md " + (tmp / "out.md") + " model=mlp");
  ASSERT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("bench on cpu:"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("training.micro_batch_size  status"), std::string::npos) << o.text;
  EXPECT_EQ(trainer::testing::read_lines(tmp / "out.csv").size(), 3u);
  EXPECT_EQ(trainer::testing::read_lines(tmp / "out.md").size(), 4u);
}

TEST(BenchCli, BadInputIsAUsageError) {
  auto o = bench_cli("bench --recipe " + kBenchTight);
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("--recipe and --grid are required"), std::string::npos) << o.text;
  o = bench_cli("bench --recipe " + kBenchTight + " --grid 'model'");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("'model' is not key=v1,v2"), std::string::npos) << o.text;
  o = bench_cli("bench --recipe " + kBenchTight + " --grid 'model=mlp,nope'");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("nope"), std::string::npos) << o.text;
  o = bench_cli("bench --recipe " + kBenchTight + " --grid 'model=mlp' --margin 1.5");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("--margin 1.5 is outside [0, 1)"), std::string::npos) << o.text;
  o = bench_cli("bench --recipe " + kBenchTight + " --grid 'model=mlp' --steps 0");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("--steps 0: at least 1 measured step"), std::string::npos) << o.text;
}

}  // namespace
