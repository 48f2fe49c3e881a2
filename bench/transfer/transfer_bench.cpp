// Transfer learning on this machine, side by side in one process:
// - BM_Loader: images decoded and augmented per second by the BatchLoader over an image_folder
//   tree of JPEGs the size of Flowers102's photos (500x375 and 375x500, written here with
//   TurboJPEG), into 224x224 training samples, with 0, 1 and 2 worker threads; the step takes
//   batches as fast as they come (no compute), so this is the loader's ceiling.
// - BM_VitStep: one training step (forward, cross entropy, backward, AdamW) of ViT-B/16 on
//   batches of 224x224 images, full fine-tuning against LoRA (rank 8 on q and v, the head
//   trained, the rest frozen), with the samples per second the step sustains and its peak
//   memory above what was allocated before (the tracking CPU allocator): the loader is the
//   bottleneck when BM_Loader's images/s is below BM_VitStep's samples/s.
// One intra-op thread per core, as a run. A smoke run (TRAINER_BENCH_SMOKE=1) writes 8 JPEGs
// and steps a ViT of one 64-wide layer instead.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "support/bench_smoke.h"
#include "trainer/data.h"
#include "trainer/loader.h"
#include "trainer/lora.h"
#include "trainer/memory.h"
#include "trainer/model.h"

namespace {

namespace fs = std::filesystem;
const c10::Device kCpu(c10::kCPU);
constexpr double kMiB = 1024.0 * 1024.0;
const std::int64_t kImages = trainer::bench::full_or_smoke<std::int64_t>(96, 8);
constexpr std::int64_t kBatch = 32;

void use_all_cores() { at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))); }

/// An image_folder tree of kImages noisy-gradient JPEGs (quality 90) in 4 classes, made once.
const std::string& jpeg_tree() {
  static const std::string root = [] {
    const fs::path dir = fs::temp_directory_path() / ("trainer_transfer_bench_" + std::to_string(::getpid()));
    tjhandle tj = tjInitCompress();
    auto gen = at::detail::createCPUGenerator(1);
    for (std::int64_t i = 0; i < kImages; ++i) {
      const int w = i % 3 == 0 ? 375 : 500, h = i % 3 == 0 ? 500 : 375;
      const at::Tensor px = at::randint(0, 256, {h, w, 3}, gen, at::TensorOptions(at::kByte));
      unsigned char* out = nullptr;
      unsigned long size = 0;
      tjCompress2(tj, px.data_ptr<std::uint8_t>(), w, 0, h, TJPF_RGB, &out, &size, TJSAMP_420, 90, 0);
      const fs::path file = dir / "train" / ("c" + std::to_string(i % 4)) / (std::to_string(i) + ".jpg");
      fs::create_directories(file.parent_path());
      std::ofstream(file, std::ios::binary)
          .write(reinterpret_cast<const char*>(out), static_cast<std::streamsize>(size));
      tjFree(out);
    }
    tjDestroy(tj);
    fs::create_directories(dir / "val");
    fs::copy(dir / "train", dir / "val", fs::copy_options::recursive);
    return dir.string();
  }();
  return root;
}

void BM_Loader(benchmark::State& state) {
  use_all_cores();
  const trainer::Config c = trainer::Config::parse("name = \"image_folder\"\nroot = \"" + jpeg_tree() + "\"\n");
  const auto ds = trainer::dataset_registry().get("image_folder").factory(c, trainer::Split::Train);
  trainer::BatchLoader loader(ds, state.range(0), 4);
  std::vector<at::Tensor> batches;
  for (std::int64_t b = 0; b < kImages; b += kBatch)
    batches.push_back(at::arange(b, std::min(kImages, b + kBatch), at::kLong));
  std::int64_t epoch = 0, images = 0;
  for (auto _ : state) {
    loader.plan(epoch++, batches);
    for (const auto& b : batches) images += loader.next(b).size();
  }
  state.counters["images_per_s"] = benchmark::Counter(double(images), benchmark::Counter::kIsRate);
  state.SetLabel(std::to_string(state.range(0)) + " workers");
}
BENCHMARK(BM_Loader)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

/// ViT-B/16 on 224x224 images, 102 classes; arg 1: LoRA.
void BM_VitStep(benchmark::State& state) {
  trainer::install_cpu_tracking_allocator();
  use_all_cores();
  torch::manual_seed(0);
  const auto m = trainer::build_model(
      trainer::Config::parse(trainer::bench::full_or_smoke<std::string>(
          "name = \"vit\"\npatch_size = 16\nhidden_dim = 768\nnum_layers = 12\nnum_heads = 12\nmlp_dim = 3072\n",
          "name = \"vit\"\npatch_size = 16\nhidden_dim = 64\nnum_layers = 1\nnum_heads = 2\nmlp_dim = 128\n")),
      trainer::DataSpec{{3, 224, 224}, 102});
  const bool lora = state.range(0) != 0;
  if (lora) {
    trainer::LoraOptions o;
    o.rank = 8;
    o.targets = {"*.q_proj", "*.v_proj"};
    o.trainable = {"heads.*"};
    trainer::apply_lora(*m, o);
  }
  const std::int64_t batch = state.range(1);
  std::vector<at::Tensor> params;
  std::int64_t trainable = 0;
  for (const auto& p : m->parameters()) {
    if (p.requires_grad()) {
      params.push_back(p);
      trainable += p.numel();
    }
  }
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-3));
  const at::Tensor x = torch::randn({batch, 3, 224, 224}), y = torch::randint(0, 102, {batch});
  const auto step = [&] {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(m->forward(x), y).backward();
    opt.step();
  };
  step();  // gradients and optimizer state exist from here on
  const std::int64_t before = trainer::memory_stats(kCpu).allocated;
  trainer::reset_peak_memory(kCpu);
  for (auto _ : state) step();
  state.counters["peak_MiB"] = double(trainer::memory_stats(kCpu).peak_allocated - before) / kMiB;
  state.counters["resident_MiB"] = double(before) / kMiB;  // parameters, gradients, optimizer state, inputs
  state.counters["trainable"] = double(trainable);
  state.counters["samples_per_s"] = benchmark::Counter(double(state.iterations() * batch), benchmark::Counter::kIsRate);
  state.SetLabel(lora ? "LoRA r=8 q,v + head" : "full fine-tuning");
}
BENCHMARK(BM_VitStep)->Args({0, 8})->Args({1, 8})->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
