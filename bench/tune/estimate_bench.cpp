// `trainer estimate`: what the probes cost (BM_Estimate_<model>: one estimate, all its probe
// steps) and how close the prediction comes to real steps at micro-batches that were not probed.
// The error table is printed after the benchmarks: training steps and evaluations, the peak's
// error, and the error on the step's own memory (the peak minus what is held at its start: the
// data sets, the model), which the data set does not dilute.
//
//   build/bench/estimate_bench --benchmark_min_time=1
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "estimate.h"
#include "short_run.h"
#include "support/bench_smoke.h"

namespace {

const std::string kRecipe = std::string(TRAINER_SOURCE_DIR) + "/recipes/fashion_mnist_tight.toml";

struct Row {
  std::string model, what;
  std::int64_t batch, micro, predicted, measured, held;
};
std::vector<Row> g_rows;

std::string work_dir() {
  const auto d = std::filesystem::temp_directory_path() / ("trainer_estimate_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d.string();
}

void BM_Estimate(benchmark::State& state, const std::string& model, std::vector<std::string> overrides) {
  overrides.insert(overrides.end(), {"training.batch_size=512", "training.micro_batch_size=512"});
  trainer::tune::EstimateRequest req;
  req.recipe = kRecipe;
  req.overrides = overrides;
  req.work_dir = work_dir();
  trainer::tune::MemoryEstimate e;
  for (auto _ : state) e = trainer::tune::estimate_memory(req);
  state.counters["probes"] = double(e.probes.size());
  state.counters["peak_MiB_at_512"] = double(e.peak) / (1 << 20);
  static std::map<std::string, bool> done;
  if (done[model]) return;
  done[model] = true;
  // Held out: none of these (batch, micro-batch) was probed (probes: 32, 64, 128 and 128 of 512).
  // A smoke run checks one of them.
  const std::vector<std::pair<std::int64_t, std::int64_t>> held_out =
      trainer::bench::full_or_smoke<std::vector<std::pair<std::int64_t, std::int64_t>>>(
          {{48, 48}, {96, 96}, {256, 256}, {512, 512}, {1024, 1024}, {1024, 256}, {768, 96}}, {{48, 48}});
  for (const auto& [batch, micro] : held_out) {
    trainer::tune::ShortRunSpec spec;
    spec.recipe = kRecipe;
    spec.overrides = overrides;
    spec.overrides.insert(spec.overrides.end(), e.probe_overrides.begin(), e.probe_overrides.end());
    spec.batch_size = batch;
    spec.micro_batch = micro;
    spec.work_dir = req.work_dir;
    spec.label = "held-out";
    const auto r = trainer::tune::run_short(spec);
    if (r.exit_code != 0) {
      state.SkipWithError(("held-out run failed: " + r.message).c_str());
      return;
    }
    g_rows.push_back({model, "step", batch, micro, e.predict(batch, micro), r.peak(), r.allocated_at_start});
  }
  // Evaluations at batches other than the one measured (the recipe's eval.batch_size, 1000).
  for (const std::int64_t eval_batch : {250, 2500}) {
    trainer::tune::ShortRunSpec spec;
    spec.recipe = kRecipe;
    spec.overrides = overrides;
    spec.overrides.insert(spec.overrides.end(), e.probe_overrides.begin(), e.probe_overrides.end());
    spec.overrides.push_back("eval.batch_size=" + std::to_string(eval_batch));
    spec.batch_size = 96;  // not a probe's: what is held when the evaluation begins differs too
    spec.micro_batch = 96;
    spec.evaluate = true;
    spec.work_dir = req.work_dir;
    spec.label = "held-out-eval";
    const auto r = trainer::tune::run_short(spec);
    if (r.exit_code != 0 || r.eval_peak == 0) {
      state.SkipWithError(("held-out evaluation failed: " + r.message).c_str());
      return;
    }
    g_rows.push_back(
        {model, "evaluation", eval_batch, 0, e.predict_eval(eval_batch), r.eval_peak, r.eval_allocated_at_start});
  }
}

BENCHMARK_CAPTURE(BM_Estimate, mlp, std::string("mlp"), std::vector<std::string>{"model=mlp"})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_Estimate, cnn, std::string("cnn"),
                  std::vector<std::string>{"model=cnn", "model.memory_format=contiguous"})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_Estimate, vit_tiny, std::string("vit_tiny"), std::vector<std::string>{"model=vit_tiny"})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

}  // namespace

int main(int argc, char** argv) {
  // A smoke run estimates the MLP alone (the three models take a minute, more on a busy machine).
  std::vector<char*> args(argv, argv + argc);
  std::string only_mlp = "--benchmark_filter=/mlp/";
  if (trainer::bench::smoke()) args.push_back(only_mlp.data());
  argc = static_cast<int>(args.size());
  argv = args.data();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\n| model | what | batch | micro-batch | predicted peak | measured peak | error | own memory error |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
  double worst = 0, worst_step = 0;
  for (const auto& r : g_rows) {
    const double err = 100.0 * std::fabs(double(r.predicted - r.measured)) / double(r.measured);
    const double step = 100.0 * std::fabs(double(r.predicted - r.measured)) / double(r.measured - r.held);
    worst = std::max(worst, err);
    worst_step = std::max(worst_step, step);
    const std::string micro = r.micro > 0 ? std::to_string(r.micro) : "-";
    std::printf("| %s | %s | %lld | %s | %.2f MiB | %.2f MiB | %.2f %% | %.2f %% |\n", r.model.c_str(), r.what.c_str(),
                static_cast<long long>(r.batch), micro.c_str(), double(r.predicted) / (1 << 20),
                double(r.measured) / (1 << 20), err, step);
  }
  std::printf("\nlargest error: %.2f %% of the peak, %.2f %% of the step's (or evaluation's) own memory\n", worst,
              worst_step);
  std::filesystem::remove_all(work_dir());
  return 0;
}
