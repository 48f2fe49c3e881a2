// The fixed cost per training step of knowing where the memory went (memory.categories, on by
// default), apart from the allocator's few nanoseconds per allocation (oom_bench's
// BM_CpuAllocator_AllocFree): the core's memory timeline driven through one step's events
// (BatchStart, AfterForward, AfterBackward, AfterOptimizerStep, BatchEnd) on the default
// recipe's CNN with AdamW, attributing its parameters, gradients and optimizer state and
// writing a line of memory.jsonl (argument 1; 0: memory.timeline_every = 0, no file). The timeline is the core's own
// (private) code, compiled in.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <filesystem>

#include "support/bench_smoke.h"
#include "train/memory_timeline.h"
#include "trainer/config.h"
#include "trainer/logging.h"
#include "trainer/model.h"
#include "trainer/optim.h"

namespace {

void BM_MemoryTimeline_Step(benchmark::State& state) {
  trainer::install_cpu_tracking_allocator();
  trainer::set_memory_categories(true);
  const trainer::DataSpec spec{{1, 28, 28}, 10};
  auto model = trainer::build_model(trainer::Config::parse("name = \"cnn\"\n"), spec);
  torch::optim::AdamW optim(model->parameters());
  // One real step: gradients and AdamW's state exist, as in every step after the first.
  model->forward(torch::randn({8, 1, 28, 28})).sum().backward();
  trainer::materialize_optimizer_state(optim);
  optim.step();
  const auto dir = std::filesystem::temp_directory_path() / "trainer_timeline_bench";
  std::filesystem::create_directories(dir);
  trainer::MemorySettings s;
  s.timeline_lines = 1000000;
  s.timeline_every = state.range(0);  // 0: attribution and sampling without the file
  trainer::MemoryTimeline timeline(s, (dir / "memory.jsonl").string(), trainer::default_logger());
  trainer::EventContext ctx;
  ctx.model = model;
  ctx.optimizer = &optim;
  trainer::RunState run;
  run.micro_batch_size = 128;
  timeline.observe(trainer::Event::FitStart, run, ctx, nullptr);
  for (auto _ : state) {
    for (const auto e : {trainer::Event::BatchStart, trainer::Event::AfterForward, trainer::Event::AfterBackward,
                         trainer::Event::AfterOptimizerStep}) {
      timeline.observe(e, run, ctx, nullptr);
    }
    ++run.global_step;
    timeline.observe(trainer::Event::BatchEnd, run, ctx, nullptr);
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_MemoryTimeline_Step)->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
