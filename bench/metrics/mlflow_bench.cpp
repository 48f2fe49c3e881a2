// What the mlflow plugin costs the training thread, and how fast metrics reach a real MLflow
// server. The plugin is the real .so, driven through its events as the core drives it.
//
// Needs a running `mlflow server`: MLFLOW_TRACKING_URI=http://127.0.0.1:PORT, or
// TRAINER_MLFLOW_SERVER_DIR=<dir of tests/mlflow/mlflow_server.sh start> (its port file).
//
//   BM_LogStep/0: one step's metrics (8 values) logged and committed, console and JSONL off: the
//                 core's own cost (MetricsLogger, no sink)
//   BM_LogStep/1: the same with the mlflow plugin's sink (REST backend, background thread)
//   BM_LogStep/2: the same with the mlflow plugin writing a file store (on the training thread)
//   BM_Delivery:  metrics per second from log() to acknowledged by the server (counter metrics/s)
#include <benchmark/benchmark.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "trainer/context.h"
#include "trainer/control.h"
#include "trainer/plugin.h"
#include "trainer/plugin_host.h"

namespace fs = std::filesystem;

namespace {

std::string server_uri() {
  if (const char* u = std::getenv("MLFLOW_TRACKING_URI"); u && *u) return u;
  if (const char* d = std::getenv("TRAINER_MLFLOW_SERVER_DIR"); d && *d) {
    std::ifstream in(fs::path(d) / "port");
    std::string port;
    if (in >> port) return "http://127.0.0.1:" + port;
  }
  return {};
}

/// The plugin in a run of its own: configured, Init and FitStart fired; Shutdown at the end.
struct PluginRun {
  trainer::PluginHost host{{TRAINER_BUILD_PLUGIN_DIR}};
  std::shared_ptr<trainer::Plugin> plugin;
  trainer::Config config;
  trainer::MetricsLogger metrics;
  trainer::EventContext ctx;
  fs::path dir;

  PluginRun(const std::string& uri, const std::string& name)
      : metrics(std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>())) {
    dir = fs::temp_directory_path() / ("trainer_mlflow_bench_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    config = trainer::Config::parse("[training]\nbatch_size = 32\n[plugins.mlflow]\ntracking_uri = \"" + uri +
                                    "\"\nexperiment = \"trainer-bench\"\nflush_interval_s = 1.0\n");
    plugin = host.load("mlflow");
    auto log = std::make_shared<spdlog::logger>("mlflow", std::make_shared<spdlog::sinks::null_sink_mt>());
    plugin->configure(config.sub("plugins.mlflow"), log);
    ctx.config = &config;
    ctx.logger = log;
    ctx.metrics = &metrics;
    ctx.run_dir = dir.string();
    fire(trainer::Event::Init);
    fire(trainer::Event::FitStart);
  }
  ~PluginRun() {
    ctx.status = trainer::RunStatus::Finished;
    fire(trainer::Event::Shutdown);
    fs::remove_all(dir);
  }
  void fire(trainer::Event e) {
    ctx.event = e;
    trainer::Control c;
    plugin->on_event(ctx, c);
  }
};

void log_step(trainer::MetricsLogger& m, std::int64_t step) {
  m.log(step, {{"train/loss", 0.5},
               {"train/accuracy", 0.9},
               {"train/lr", 1e-3},
               {"train/epoch", 1.5},
               {"train/samples_per_s", 1000.0},
               {"train/micro_batch_size", 32},
               {"memory/allocated_mb", 100.0},
               {"memory/peak_mb", 200.0}});
  m.commit();
}

void BM_LogStep(benchmark::State& state) {
  const std::string uri = server_uri();
  if (state.range(0) == 1 && uri.empty()) {
    state.SkipWithError("no MLflow server: set MLFLOW_TRACKING_URI or TRAINER_MLFLOW_SERVER_DIR");
    return;
  }
  std::unique_ptr<PluginRun> run;
  trainer::MetricsLogger bare(
      std::make_shared<spdlog::logger>("bare", std::make_shared<spdlog::sinks::null_sink_mt>()));
  if (state.range(0) == 1) run = std::make_unique<PluginRun>(uri, "rest");
  if (state.range(0) == 2) {
    run = std::make_unique<PluginRun>(
        "file:" + (fs::temp_directory_path() / ("trainer_mlflow_bench_store_" + std::to_string(::getpid()))).string(),
        "file");
  }
  trainer::MetricsLogger& m = run ? run->metrics : bare;
  std::int64_t step = 0;
  for (auto _ : state) log_step(m, ++step);
  state.SetItemsProcessed(state.iterations() * 8);
  state.counters["s_per_metric"] = benchmark::Counter(static_cast<double>(state.iterations() * 8),
                                                      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  run.reset();
  fs::remove_all(fs::temp_directory_path() / ("trainer_mlflow_bench_store_" + std::to_string(::getpid())));
}
BENCHMARK(BM_LogStep)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

/// Logs `range(0)` steps of 8 metrics as fast as possible, then waits for the server to have
/// them all (Shutdown waits for the queue): metrics delivered per second of wall time.
void BM_Delivery(benchmark::State& state) {
  const std::string uri = server_uri();
  if (uri.empty()) {
    state.SkipWithError("no MLflow server: set MLFLOW_TRACKING_URI or TRAINER_MLFLOW_SERVER_DIR");
    return;
  }
  const std::int64_t steps = state.range(0);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      PluginRun run(uri, "delivery");
      for (std::int64_t s = 1; s <= steps; ++s) log_step(run.metrics, s);
    }  // Shutdown: everything sent
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(secs);
  }
  state.counters["metrics/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * steps * 8), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Delivery)->Arg(2500)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
