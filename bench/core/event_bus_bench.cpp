// Cost of firing one event with 0, 1 and 10 plugins loaded from a real .so.
#include <benchmark/benchmark.h>

#include "trainer/event_bus.h"
#include "trainer/plugin_host.h"

namespace {

void BM_EventBus_Dispatch(benchmark::State& state) {
  trainer::PluginHost host({TRAINER_BENCH_PLUGIN_DIR});
  trainer::EventBus bus;
  for (int i = 0; i < state.range(0); ++i) bus.add(host.load("noop"));
  trainer::EventContext ctx;
  ctx.event = trainer::Event::BeforeForward;
  for (auto _ : state) {
    trainer::Control control;
    bus.dispatch(ctx, control);
    benchmark::DoNotOptimize(control);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EventBus_Dispatch)->Arg(0)->Arg(1)->Arg(10);

// What the core pays per event when no plugin subscribed: it skips the dispatch.
void BM_EventBus_SubscriberCheck(benchmark::State& state) {
  trainer::EventBus bus;
  for (auto _ : state) benchmark::DoNotOptimize(bus.subscribers(trainer::Event::BeforeForward));
}
BENCHMARK(BM_EventBus_SubscriberCheck);

}  // namespace

BENCHMARK_MAIN();
