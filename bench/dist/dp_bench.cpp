// Data-parallel training on the CPU: one rank against two (`trainer launch --nproc 2`, Gloo
// over 127.0.0.1, one thread per rank) with the same global batch, and one rank with two
// threads (the other way to use both cores). Each iteration is a real run of 40 steps; its
// step time is the mean of the last 30 (the first window warms up). Counters: samples/s, the
// time per step in collectives (dist/comm_s: agreements and the gradients' all-reduce, waiting
// for the slower rank included) and its share of the step, and of that the gradients'
// all-reduce alone (dist/all_reduce_s, after the agreement has put the ranks in step: with
// overlap, what is left of it after the backward). Two ranks run twice, with the all-reduce
// after the backward and overlapped with it, in buckets of 256 KiB so that there is something
// to overlap (the models' gradients are 0.9 and 1.7 MB).
//
//   build/bench/dp_bench
#include <benchmark/benchmark.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

#include "support/bench_smoke.h"

namespace {

namespace fs = std::filesystem;

// A smoke run: 12 steps, windows of 4.
const int kSteps = trainer::bench::full_or_smoke(40, 12), kLogEvery = trainer::bench::full_or_smoke(10, 4);

/// The mean of `name` over the windows after the first, from a metrics.jsonl.
double mean_after_first(const std::string& file, const std::string& name) {
  std::ifstream in(file);
  const std::regex re("\"step\":([0-9]+),\"name\":\"" + name + "\",\"value\":([-0-9.e+]+)");
  std::string line;
  double sum = 0;
  int n = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, re) && std::stoi(m[1]) > kLogEvery) {
      sum += std::stod(m[2]);
      ++n;
    }
  }
  return n > 0 ? sum / n : 0.0;
}

void BM_DataParallel(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const bool cnn = state.range(1) == 1;
  const int threads = static_cast<int>(state.range(2));
  const bool overlap = state.range(3) == 1;
  const int batch = cnn ? 64 : 256;
  const fs::path dir = fs::temp_directory_path() / ("dp_bench_" + std::to_string(::getpid()));
  const std::string model =
      cnn ? "model=cnn model.batch_norm=false model.dropout=0.0 model.memory_format=contiguous" : "model=mlp";
  const std::string recipe = dir.string() + ".toml";
  std::ofstream(recipe) << "defaults = [\"model/mlp\", \"dataset/fashion_mnist\", \"optim/adamw\"]\n"
                           "[run]\nname = \"dp_bench\"\nseed = 1\n";
  const std::string args =
      " --recipe " + recipe + " " + model + " training.batch_size=" + std::to_string(batch) +
      " training.max_steps=" + std::to_string(kSteps) + " training.log_every=" + std::to_string(kLogEvery) +
      " dataset.limit=" + std::to_string(batch * kSteps) +
      " eval.every_epochs=0 eval.at_end=false checkpoint.at_end=false metrics.console=false runtime.num_threads=" +
      std::to_string(threads) + " distributed.bucket_mb=0.25 distributed.overlap=" + (overlap ? "true" : "false") +
      " --log-level warn --run-dir " + dir.string();
  const std::string cmd = "TRAINER_CONFIG_PATH=" TRAINER_SOURCE_DIR "/configs " TRAINER_CLI +
                          (ranks > 1 ? " launch --nproc " + std::to_string(ranks) + " --" : std::string()) + args +
                          " > " + dir.string() + ".out 2>&1";
  double samples = 0, comm = 0, share = 0, reduce = 0, reduce_share = 0;
  for (auto _ : state) {
    fs::remove_all(dir);
    if (std::system(cmd.c_str()) != 0) {
      state.SkipWithError(("the run failed: " + cmd).c_str());
      break;
    }
    const std::string metrics = (dir / "metrics.jsonl").string();
    const double s = mean_after_first(metrics, "train/samples_per_s");
    if (s <= 0) {
      state.SkipWithError("no train/samples_per_s in metrics.jsonl");
      break;
    }
    state.SetIterationTime(batch / s);  // seconds per step
    samples += s;
    comm += mean_after_first(metrics, "dist/comm_s");
    share += mean_after_first(metrics, "dist/comm_share");
    reduce += mean_after_first(metrics, "dist/all_reduce_s");
    reduce_share += mean_after_first(metrics, "dist/all_reduce_share");
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["samples_per_s"] = samples / n;
  state.counters["comm_ms_per_step"] = 1000.0 * comm / n;
  state.counters["comm_share"] = share / n;
  state.counters["all_reduce_ms_per_step"] = 1000.0 * reduce / n;
  state.counters["all_reduce_share"] = reduce_share / n;
  fs::remove_all(dir);
  fs::remove(dir.string() + ".out");
  fs::remove(recipe);
}

// {ranks, model (0 = MLP, global batch 256; 1 = CNN without BatchNorm, 64), threads per rank,
//  overlap (the all-reduce inside the backward; no collective in a run of one)}
BENCHMARK(BM_DataParallel)
    ->ArgNames({"ranks", "cnn", "threads", "overlap"})
    ->Args({1, 0, 1, 0})
    ->Args({2, 0, 1, 0})
    ->Args({2, 0, 1, 1})
    ->Args({1, 0, 2, 0})
    ->Args({1, 1, 1, 0})
    ->Args({2, 1, 1, 0})
    ->Args({2, 1, 1, 1})
    ->Args({1, 1, 2, 0})
    ->UseManualTime()
    ->Iterations(trainer::bench::full_or_smoke(3, 1))
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
