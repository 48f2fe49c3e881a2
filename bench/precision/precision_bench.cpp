// What mixed precision and activation checkpointing trade on this machine, side by side in one
// process: a 1024^3 matmul in float32 and bfloat16; a training step (forward under autocast or
// not, cross entropy, backward, AdamW step) of the default recipe's CNN and of the tiny ViT in
// fp32 and bf16 autocast; the ViT's step with and without activation checkpointing. Counters:
// peak_MiB is the step's peak memory above what was allocated before it (the tracking CPU
// allocator), samples_per_s the training throughput. One intra-op thread per core, as a run.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "trainer/activation_checkpoint.h"
#include "trainer/memory.h"
#include "trainer/model.h"
#include "trainer/precision.h"

namespace {

const c10::Device kCpu(c10::kCPU);
constexpr std::int64_t kBatch = 128;
constexpr double kMiB = 1024.0 * 1024.0;

/// As a run does by default: one intra-op thread per core.
void use_all_cores() { at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))); }

void BM_Matmul1024(benchmark::State& state) {
  use_all_cores();
  const auto dtype = state.range(0) ? at::kBFloat16 : at::kFloat;
  const at::Tensor a = torch::randn({1024, 1024}).to(dtype), b = torch::randn({1024, 1024}).to(dtype);
  for (auto _ : state) benchmark::DoNotOptimize(at::matmul(a, b));
  state.SetLabel(state.range(0) ? "bf16" : "fp32");
}
BENCHMARK(BM_Matmul1024)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

std::shared_ptr<trainer::Model> make(const std::string& model) {
  torch::manual_seed(0);
  const std::string cfg =
      model == "cnn" ? "name = \"cnn\"\nchannels = [32, 64]\nhidden = 128\ndropout = 0.25\n"
      : model == "vit_p4"
          ? "name = \"vit\"\npatch_size = 4\nhidden_dim = 64\nnum_layers = 4\nnum_heads = 4\nmlp_dim = 128\n"
          : "name = \"vit\"\npatch_size = 7\nhidden_dim = 64\nnum_layers = 4\nnum_heads = 4\nmlp_dim = 128\n";
  return trainer::build_model(trainer::Config::parse(cfg), trainer::DataSpec{{1, 28, 28}, 10});
}

/// One training step per iteration; `bf16`: forward and loss under CPU bf16 autocast.
void train_steps(benchmark::State& state, trainer::Model& m, bool bf16) {
  trainer::install_cpu_tracking_allocator();
  use_all_cores();
  torch::optim::AdamW opt(m.parameters(), torch::optim::AdamWOptions(1e-3));
  const at::Tensor x = torch::randn({kBatch, 1, 28, 28}), y = torch::randint(0, 10, {kBatch});
  const auto step = [&] {
    opt.zero_grad();
    at::Tensor loss;
    {
      std::optional<trainer::AutocastGuard> autocast;
      if (bf16) autocast.emplace(c10::kCPU, c10::kBFloat16);
      loss = torch::nn::functional::cross_entropy(m.forward(x), y);
    }
    loss.backward();
    opt.step();
  };
  step();  // optimizer state and gradients exist from here on
  const std::int64_t before = trainer::memory_stats(kCpu).allocated;
  trainer::reset_peak_memory(kCpu);
  for (auto _ : state) step();
  state.counters["peak_MiB"] = double(trainer::memory_stats(kCpu).peak_allocated - before) / kMiB;
  state.counters["samples_per_s"] =
      benchmark::Counter(double(state.iterations() * kBatch), benchmark::Counter::kIsRate);
}

void BM_TrainStep(benchmark::State& state, const std::string& model) {
  const auto m = make(model);
  const bool bf16 = state.range(0) != 0;
  state.SetLabel(bf16 ? "bf16 autocast" : "fp32");
  train_steps(state, *m, bf16);
}
BENCHMARK_CAPTURE(BM_TrainStep, cnn, std::string("cnn"))->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainStep, vit_tiny, std::string("vit_tiny"))->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

/// The ViT with 4x4 patches (50 tokens), every block checkpointed or none.
void BM_VitCheckpoint(benchmark::State& state) {
  const auto m = make("vit_p4");
  const bool ckpt = state.range(0) != 0;
  if (ckpt) {
    for (const auto& b : m->blocks()) {
      b->set_wrapper([](trainer::Block& blk, const at::Tensor& x) { return trainer::checkpoint_block(blk, x); });
    }
  }
  state.SetLabel(ckpt ? "checkpointed" : "plain");
  train_steps(state, *m, false);
}
BENCHMARK(BM_VitCheckpoint)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
