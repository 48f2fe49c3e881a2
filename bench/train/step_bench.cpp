// Trainer step time against a hand-written LibTorch loop on the same model, data, optimizer
// and batch. Both time only the step loop (data fetch, forward, backward, optimizer step);
// model and data construction are outside the timed region. Ratio target: <= 1.02.
// And trainer's step of a model written in Python (model "torchscript":
// docs/examples/torchscript/fashion_cnn.py, the built-in cnn's network with dropout 0.25)
// against the built-in cnn with the same settings. Ratio target: <= 1.10.
// And "mlp_unchecked": the MLP with training.on_nonfinite = "ignore", the cost of the default
// check of the loss and the gradients' norm before each optimizer step. And "mlp_ema": the MLP
// with the ema plugin, the cost of averaging every parameter after each optimizer step. And
// "mlp_nocat"/"cnn_nocat": memory.categories = false, against the default (memory split into
// categories, a line of memory.jsonl per step), the cost of knowing where the memory went.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "support/bench_smoke.h"
#include "trainer/data.h"
#include "trainer/optim.h"
#include "trainer/plugin_host.h"
#include "trainer/recipe.h"
#include "trainer/runtime.h"
#include "trainer/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t kBatch = 128;

std::int64_t steps_for(const std::string& model) {
  return trainer::bench::full_or_smoke<std::int64_t>(model.rfind("cnn", 0) == 0 ? 20 : 200, 3);
}

/// docs/examples/torchscript/fashion_cnn.py's module, scripted and saved by Python once per
/// process; empty when Python could not.
const std::string& torchscript_cnn() {
  static const std::string file = [] {
    const auto path = std::filesystem::temp_directory_path() / "trainer_step_bench_fashion_cnn.pt";
    const std::string command = std::string(TRAINER_BENCH_PYTHON) + " " + TRAINER_SOURCE_DIR +
                                "/docs/examples/torchscript/fashion_cnn.py " + path.string() + " > /dev/null";
    return std::system(command.c_str()) == 0 ? path.string() : std::string();
  }();
  return file;
}

/// The [model] section of a benchmark's model.
std::string model_section(const std::string& model) {
  if (model == "cnn_torchscript") return "name = \"torchscript\"\npath = \"" + torchscript_cnn() + "\"\n";
  if (model == "cnn_dropout") return "name = \"cnn\"\ndropout = 0.25\n";
  if (model == "mlp_unchecked" || model == "mlp_ema" || model == "mlp_nocat") return "name = \"mlp\"\n";
  if (model == "cnn_nocat") return "name = \"cnn\"\n";
  return "name = \"" + model + "\"\n";
}

trainer::Config make_config(const std::string& model, std::int64_t steps) {
  trainer::LoadedRecipe r;
  r.config = trainer::Config::parse(
      "[run]\nseed = 1\n[model]\n" + model_section(model) + "[dataset]\nname = \"synthetic\"\nsize = " +
      std::to_string(steps * kBatch) + "\n[training]\nbatch_size = " + std::to_string(kBatch) +
      (model == "mlp_unchecked" ? "\non_nonfinite = \"ignore\"" : "") +
      "\nshuffle = false\n[optim]\nname = \"adamw\"\n[eval]\nevery_epochs = 0\nat_end = "
      "false\n[checkpoint]\nevery_epochs = 0\n"
      "at_end = false\n[metrics]\njsonl = false\nconsole = false\n[runtime]\nnum_threads = 2\n" +
      (model.size() > 6 && model.substr(model.size() - 6) == "_nocat" ? "[memory]\ncategories = false\n" : ""));
  trainer::validate_recipe(r);
  return r.config;
}

void report(benchmark::State& state, std::int64_t steps, double total_seconds) {
  state.SetItemsProcessed(state.iterations() * steps * kBatch);
  state.counters["ms_per_step"] = total_seconds * 1e3 / double(steps * state.iterations());
}

/// Times FitStart..FitEnd from inside the run.
class LoopTimer final : public trainer::Plugin {
 public:
  std::string name() const override { return "loop_timer"; }
  std::vector<trainer::Event> events() const override { return {trainer::Event::FitStart, trainer::Event::FitEnd}; }
  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (ctx.event == trainer::Event::FitStart) start = Clock::now();
    if (ctx.event == trainer::Event::FitEnd) seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  Clock::time_point start;
  double seconds = 0;
};

void BM_Trainer_Step(benchmark::State& state, const std::string& model) {
  if (model == "cnn_torchscript" && torchscript_cnn().empty()) {
    state.SkipWithError(TRAINER_BENCH_PYTHON " could not script docs/examples/torchscript/fashion_cnn.py");
    return;
  }
  const std::int64_t steps = steps_for(model);
  const trainer::Config cfg = make_config(model, steps);
  const auto dir = std::filesystem::temp_directory_path() / "trainer_step_bench";
  double total = 0;
  for (auto _ : state) {
    auto timer = std::make_shared<LoopTimer>();
    trainer::TrainerOptions o;
    o.config = cfg;
    o.plugins = {timer};
    if (model == "mlp_ema") o.plugins.push_back(trainer::PluginHost({TRAINER_BUILD_PLUGIN_DIR}).load("ema"));
    o.run_dir = dir.string();
    o.log_level = "error";
    trainer::Trainer t(std::move(o));
    const auto r = t.fit();
    if (r.exit_code != 0) state.SkipWithError(r.message.c_str());
    state.SetIterationTime(timer->seconds);
    total += timer->seconds;
  }
  std::filesystem::remove_all(dir);
  report(state, steps, total);
}

void BM_HandLoop_Step(benchmark::State& state, const std::string& model_name) {
  const std::int64_t steps = steps_for(model_name);
  const trainer::Config cfg = make_config(model_name, steps);
  at::set_num_threads(2);
  trainer::tune_cpu_allocator();  // what the trainer does with runtime.tune_malloc = true
  double total = 0;
  for (auto _ : state) {
    torch::manual_seed(1);
    auto ds = trainer::dataset_registry().get("synthetic").factory(cfg.sub("dataset"), trainer::Split::Train);
    auto model = trainer::model_registry().get(model_name).factory(cfg.sub("model"), ds->spec());
    std::vector<at::Tensor> params = model->parameters();
    auto opt = trainer::optimizer_registry().get("adamw").factory(cfg.sub("optim"), params);
    model->train();
    const auto start = Clock::now();
    for (std::int64_t s = 0; s < steps; ++s) {
      trainer::Batch b = ds->get(at::arange(s * kBatch, (s + 1) * kBatch, at::kLong));
      for (auto& p : params) p.mutable_grad() = at::Tensor();
      at::Tensor loss = at::cross_entropy_loss(model->forward(b.inputs), b.targets);
      loss.backward();
      opt->step();
      benchmark::DoNotOptimize(loss.item<double>());
    }
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    state.SetIterationTime(secs);
    total += secs;
  }
  report(state, steps, total);
}

BENCHMARK_CAPTURE(BM_HandLoop_Step, mlp, std::string("mlp"))->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Trainer_Step, mlp, std::string("mlp"))->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Trainer_Step, mlp_unchecked, std::string("mlp_unchecked"))
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Trainer_Step, mlp_ema, std::string("mlp_ema"))->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Trainer_Step, mlp_nocat, std::string("mlp_nocat"))->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_HandLoop_Step, cnn, std::string("cnn"))->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Trainer_Step, cnn, std::string("cnn"))->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Trainer_Step, cnn_nocat, std::string("cnn_nocat"))->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Trainer_Step, cnn_dropout, std::string("cnn_dropout"))
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Trainer_Step, cnn_torchscript, std::string("cnn_torchscript"))
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
