// OOM recovery on CPU through the memory budget: what a recovered step costs, how close
// oom_backoff gets to the largest micro-batch that fits, and what the tracking allocator
// costs per allocation. Real allocations refused by the budget, the real oom_backoff .so.
#include <benchmark/benchmark.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "support/bench_smoke.h"
#include "trainer/memory.h"
#include "trainer/plugin_host.h"
#include "trainer/recipe.h"
#include "trainer/trainer.h"

namespace {

using trainer::bench::full_or_smoke;
using Clock = std::chrono::steady_clock;
const c10::Device kCpu(c10::kCPU);
constexpr std::int64_t kBatch = 128;

trainer::Config make_config(std::int64_t steps, std::int64_t micro, bool backoff, std::int64_t grow_after = 50) {
  trainer::LoadedRecipe r;
  r.config = trainer::Config::parse(
      "[run]\nseed = 1\n[model]\nname = \"cnn\"\nbatch_norm = false\n[dataset]\nname = \"synthetic\"\nsize = " +
      std::to_string(steps * kBatch) + "\n[training]\nbatch_size = " + std::to_string(kBatch) +
      "\nmicro_batch_size = " + std::to_string(micro) +
      "\nshuffle = false\n[optim]\nname = \"sgd\"\nlr = 0.01\n[eval]\nevery_epochs = 0\nat_end = "
      "false\n[checkpoint]\nevery_epochs = "
      "0\n"
      "at_end = false\n[metrics]\njsonl = false\nconsole = false\n[runtime]\nnum_threads = 2\n" +
      (backoff ? "[plugins]\nload = [\"oom_backoff\"]\n[plugins.oom_backoff]\ngrow_after = " +
                     std::to_string(grow_after) + "\n"
               : ""));
  std::vector<std::shared_ptr<trainer::Plugin>> plugins;
  if (backoff) plugins.push_back(trainer::PluginHost().load("oom_backoff"));
  trainer::validate_recipe(r, trainer::plugin_config_sections(plugins));
  return r.config;
}

/// Times the loop, optionally squeezes the budget before a phase of every step (first attempt
/// only) and acts as a one-shot policy (retry with half, configured size again next batch),
/// or holds a fixed budget relative to the memory in use at FitStart.
class Harness final : public trainer::Plugin {
 public:
  std::string name() const override { return "harness"; }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::FitStart,       E::FitEnd,      E::BatchStart,        E::BeforeForward,
            E::BeforeBackward, E::OutOfMemory, E::AfterOptimizerStep};
  }
  int default_priority() const override { return -10; }
  void on_event(trainer::EventContext& ctx, trainer::Control& c) override {
    using E = trainer::Event;
    switch (ctx.event) {
      case E::FitStart:
        start = Clock::now();
        if (budget_above_baseline > 0) {
          trainer::set_memory_limit(kCpu, trainer::memory_stats(kCpu).allocated + budget_above_baseline);
        }
        break;
      case E::FitEnd:
        seconds = std::chrono::duration<double>(Clock::now() - start).count();
        trainer::set_memory_limit(kCpu, 0);
        break;
      case E::BatchStart:
        armed_ = squeeze_at.has_value();
        if (squeeze_at) c.micro_batch_size = kBatch;
        trainer::reset_peak_memory(kCpu);
        base_ = trainer::memory_stats(kCpu).allocated;
        break;
      case E::OutOfMemory:
        if (squeeze_at) {
          trainer::set_memory_limit(kCpu, 0);
          c.retry_with_micro_batch = ctx.oom->micro_batch_size / 2;
        }
        break;
      case E::AfterOptimizerStep:
        peak_need = std::max(peak_need, trainer::memory_stats(kCpu).peak_allocated - base_);
        final_micro = ctx.state.micro_batch_size;
        break;
      default:
        if (armed_ && squeeze_at == ctx.event && ctx.state.micro_batch_index == 0) {
          armed_ = false;
          trainer::set_memory_limit(kCpu, trainer::memory_stats(kCpu).allocated + 1024);
        }
    }
  }
  std::optional<trainer::Event> squeeze_at;
  std::int64_t budget_above_baseline = 0;
  Clock::time_point start;
  double seconds = 0;
  std::int64_t peak_need = 0, final_micro = 0;

 private:
  bool armed_ = false;
  std::int64_t base_ = 0;
};

trainer::RunResult fit(const trainer::Config& cfg, std::shared_ptr<Harness> h, bool backoff) {
  trainer::TrainerOptions o;
  o.config = cfg;
  if (backoff) o.plugins.push_back(trainer::PluginHost().load("oom_backoff"));
  o.plugins.push_back(h);
  o.run_dir = (std::filesystem::temp_directory_path() / "trainer_oom_bench").string();
  o.log_level = "off";
  trainer::Trainer t(std::move(o));
  auto r = t.fit();
  std::filesystem::remove_all(o.run_dir);
  return r;
}

/// Step time when every step runs out of memory once (before forward or before backward)
/// and is re-run as two micro-batches of 64, against clean steps of 128.
void BM_OomRecovery_Step(benchmark::State& state) {
  const std::int64_t steps = full_or_smoke<std::int64_t>(10, 2);
  const int where = static_cast<int>(state.range(0));  // 0 clean, 1 forward, 2 backward
  const auto cfg = make_config(steps, kBatch, false);
  double total = 0;
  for (auto _ : state) {
    auto h = std::make_shared<Harness>();
    if (where == 1) h->squeeze_at = trainer::Event::BeforeForward;
    if (where == 2) h->squeeze_at = trainer::Event::BeforeBackward;
    const auto r = fit(cfg, h, false);
    if (r.exit_code != 0) state.SkipWithError(r.message.c_str());
    state.SetIterationTime(h->seconds);
    total += h->seconds;
  }
  state.counters["ms_per_step"] = total * 1e3 / double(steps * state.iterations());
  state.SetLabel(where == 0 ? "clean" : where == 1 ? "oom_before_forward" : "oom_in_backward");
}
BENCHMARK(BM_OomRecovery_Step)->Arg(0)->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMillisecond);

/// Under a budget that fits micro-batches up to some L < 128: L by exhaustive search (one
/// step at every size), then where oom_backoff ends after 60 steps starting from 128. (A smoke
/// run searches in strides of 16 and runs 6 steps.)
void BM_OomBackoff_FinalMicroBatch(benchmark::State& state) {
  for (auto _ : state) {
    // Calibrate: memory one step needs above the baseline at each micro-batch size.
    auto need_at = [&](std::int64_t micro) {
      auto h = std::make_shared<Harness>();
      fit(make_config(1, micro, false), h, false);
      return h->peak_need;
    };
    const std::int64_t budget = (need_at(128) + need_at(64)) / 2;
    std::int64_t largest = 0;
    const std::int64_t stride = full_or_smoke<std::int64_t>(1, 16);
    for (std::int64_t micro = kBatch; micro >= 1 && largest == 0; micro -= stride) {
      auto h = std::make_shared<Harness>();
      h->budget_above_baseline = budget;
      if (fit(make_config(1, micro, false), h, false).exit_code == 0) largest = micro;
    }
    auto h = std::make_shared<Harness>();
    h->budget_above_baseline = budget;
    const auto r = fit(make_config(full_or_smoke<std::int64_t>(60, 6), kBatch, true, 5), h, true);
    if (r.exit_code != 0) state.SkipWithError(r.message.c_str());
    state.counters["largest_fitting"] = double(largest);
    state.counters["final_micro"] = double(h->final_micro);
    state.counters["ratio"] = largest > 0 ? double(h->final_micro) / double(largest) : 0.0;
  }
}
BENCHMARK(BM_OomBackoff_FinalMicroBatch)->Iterations(1)->Unit(benchmark::kSecond);

/// The tracking allocator's cost per allocation + free of 4 KiB, against c10's default CPU
/// allocator (both called directly, as LibTorch does for every CPU tensor): 0 c10's, 1 the
/// tracking allocator with memory categories (the default), 2 without them.
void BM_CpuAllocator_AllocFree(benchmark::State& state) {
  trainer::install_cpu_tracking_allocator();
  trainer::set_memory_categories(state.range(0) != 2);
  c10::Allocator* a = state.range(0) >= 1 ? c10::GetCPUAllocator() : c10::GetDefaultCPUAllocator();
  for (auto _ : state) {
    c10::DataPtr p = a->allocate(4096);
    benchmark::DoNotOptimize(p.get());
  }
  trainer::set_memory_categories(true);
  state.SetLabel(state.range(0) == 0 ? "c10 default" : state.range(0) == 1 ? "tracking, categories" : "tracking");
}
BENCHMARK(BM_CpuAllocator_AllocFree)->Arg(0)->Arg(1)->Arg(2);

void BM_TrackingAllocator_AllocationsPerStep(benchmark::State& state) {
  const std::int64_t steps = full_or_smoke<std::int64_t>(10, 2);
  const auto cfg = make_config(steps, kBatch, false);
  for (auto _ : state) {
    auto h = std::make_shared<Harness>();
    const auto before = trainer::memory_stats(kCpu).num_allocations;
    fit(cfg, h, false);
    state.counters["allocations_per_step"] =
        double(trainer::memory_stats(kCpu).num_allocations - before) / double(steps);
  }
}
BENCHMARK(BM_TrackingAllocator_AllocationsPerStep)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
