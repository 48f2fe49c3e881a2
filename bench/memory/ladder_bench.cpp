// The time and memory each rung of oom_backoff's memory ladder costs, side by side in one
// process: a training step (forward, cross entropy, backward, optimizer step) of an effective
// batch of 128 for a ViT (6 encoder layers, 4x4 patches: 50 tokens) and the default recipe's
// CNN, plain and on each rung: the micro-batch halved (2, 4, 8 micro-batches, gradients
// accumulated), a quarter / half / all of the ViT's blocks checkpointed (the CNN has none), and
// AdamW's moments in bf16 and in 8 bits (the compact AdamW against LibTorch's). Counters:
// peak_MiB is the step's peak above what was allocated before it (the tracking CPU allocator),
// state_MiB the optimizer state, samples_per_s the throughput. One intra-op thread per core,
// as a run.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <thread>

#include "optim/adamw8bit.h"
#include "support/bench_smoke.h"
#include "trainer/activation_checkpoint.h"
#include "trainer/memory.h"
#include "trainer/model.h"
#include "trainer/optim.h"

namespace {

const c10::Device kCpu(c10::kCPU);
constexpr double kMiB = 1024.0 * 1024.0;

std::int64_t batch() { return trainer::bench::full_or_smoke<std::int64_t>(128, 16); }

std::shared_ptr<trainer::Model> make(const std::string& model) {
  torch::manual_seed(0);
  const std::string cfg = model == "cnn" ? "name = \"cnn\"\nchannels = [32, 64]\nhidden = 128\ndropout = 0.0\n"
                                         : "name = \"vit\"\npatch_size = 4\nhidden_dim = 96\nnum_layers = 6\n"
                                           "num_heads = 4\nmlp_dim = 192\ndropout = 0.0\n";
  return trainer::build_model(trainer::Config::parse(cfg), trainer::DataSpec{{1, 28, 28}, 10});
}

/// A rung as the benchmark's argument: 0 plain; 1..3 micro-batch / 2, 4, 8; 4..6 a quarter,
/// half, all blocks checkpointed; 7 bf16 moments; 8 8-bit moments; 9..12 micro-batch / 16, 32,
/// 64, 128 (micro-batches of 8 down to 1); 13 all blocks checkpointed at micro-batches of 8.
struct Rung {
  std::int64_t micro_batches = 1;
  double blocks = 0;  ///< fraction of the blocks checkpointed
  int bits = 32;
  std::string label;
};

Rung rung(std::int64_t arg) {
  switch (arg) {
    case 1:
    case 2:
    case 3:
    case 9:
    case 10:
    case 11:
    case 12: {
      const std::int64_t n = std::int64_t{1} << (arg < 9 ? arg : arg - 5);
      return {n, 0, 32, "micro_batch: " + std::to_string(n) + " micro-batches"};
    }
    case 13:
      return {16, 1.0, 32, "checkpoint: all blocks, 16 micro-batches"};
    case 4:
      return {1, 0.25, 32, "checkpoint: 1/4 of the blocks"};
    case 5:
      return {1, 0.5, 32, "checkpoint: 1/2 of the blocks"};
    case 6:
      return {1, 1.0, 32, "checkpoint: all blocks"};
    case 7:
      return {1, 0, 16, "optimizer_bf16"};
    case 8:
      return {1, 0, 8, "optimizer_8bit"};
    default:
      return {1, 0, 32, "plain"};
  }
}

void BM_Rung(benchmark::State& state, const std::string& model) {
  trainer::install_cpu_tracking_allocator();
  at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const Rung r = rung(state.range(0));
  const auto m = make(model);
  const auto blocks = m->blocks();
  if (r.blocks > 0 && blocks.empty()) {
    state.SkipWithError("the model has no blocks");
    return;
  }
  const auto wrapped = static_cast<std::size_t>(std::ceil(r.blocks * double(blocks.size())));
  for (std::size_t i = 0; i < wrapped; ++i) {
    blocks[i]->set_wrapper([](trainer::Block& b, const at::Tensor& x) { return trainer::checkpoint_block(b, x); });
  }
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (r.bits == 32) {
    opt = std::make_unique<torch::optim::AdamW>(m->parameters(), torch::optim::AdamWOptions(1e-3));
  } else {
    opt = std::make_unique<trainer::detail::AdamW8bit>(m->parameters(), torch::optim::AdamWOptions(1e-3), r.bits);
  }
  const std::int64_t n = batch(), micro = std::max<std::int64_t>(1, n / r.micro_batches);
  const std::int64_t micro_batches = n / micro;
  const at::Tensor x = torch::randn({n, 1, 28, 28}), y = torch::randint(0, 10, {n});
  const auto step = [&] {
    opt->zero_grad();
    for (std::int64_t i = 0; i < micro_batches; ++i) {
      const at::Tensor loss = torch::nn::functional::cross_entropy(m->forward(x.narrow(0, i * micro, micro)),
                                                                   y.narrow(0, i * micro, micro)) /
                              double(micro_batches);
      loss.backward();
    }
    opt->step();
  };
  step();  // optimizer state and gradients exist from here on
  std::int64_t state_bytes = 0;
  for (const auto& p : m->parameters()) {
    for (const auto& t : trainer::optimizer_state_of(*opt, p)) state_bytes += static_cast<std::int64_t>(t.nbytes());
  }
  const std::int64_t before = trainer::memory_stats(kCpu).allocated;
  trainer::reset_peak_memory(kCpu);
  for (auto _ : state) step();
  state.counters["peak_MiB"] = double(trainer::memory_stats(kCpu).peak_allocated - before) / kMiB;
  state.counters["state_MiB"] = double(state_bytes) / kMiB;
  state.counters["samples_per_s"] = benchmark::Counter(double(state.iterations() * n), benchmark::Counter::kIsRate);
  state.SetLabel(r.label);
}
BENCHMARK_CAPTURE(BM_Rung, vit, std::string("vit"))->DenseRange(0, 13)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Rung, cnn, std::string("cnn"))
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->Arg(7)
    ->Arg(8)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
