// Loading a Hugging Face BERT directory (config.json + model.safetensors) into model "bert",
// as a run does when model.path names it: the time, how far the process's resident memory
// rises at its peak (VmHWM, reset before the load: anonymous memory and mapped file pages
// together), and the anonymous memory it holds after the load (RssAnon: the model, without
// the file's pages, which the page cache can reclaim). float32 from a
// float32 file, and bfloat16 (model.dtype) from the same file, which is read into the model's
// dtype without a float32 copy. bench/text/bert_vs_transformers.py writes BERT-base (110 M
// parameters) and times transformers' from_pretrained the same way; docs/benchmarks.md has both.
//
//   TRAINER_BERT_DIR=DIR build/bench/bert_load_bench --benchmark_filter=BM_BertLoad/bf16:0
//   (one load per process: freed memory stays resident and would hide the next load's rise)
//   (default: the tests' small BERT directory, build/tests/hf_models/bert)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/bench_smoke.h"
#include "trainer/config.h"
#include "trainer/model.h"

namespace {

std::string bert_dir() {
  const char* dir = std::getenv("TRAINER_BERT_DIR");
  return dir && *dir ? dir : TRAINER_HF_MODELS "/bert";
}

/// A field of /proc/self/status in kB (VmRSS, VmHWM).
double status_kb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, field.size() + 1, field + ":") == 0) return std::stod(line.substr(field.size() + 1));
  }
  return 0;
}

/// Sets the peak resident size (VmHWM) to the current one; false where the kernel does not.
bool reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return status_kb("VmHWM") - status_kb("VmRSS") < 1024;
}

/// The directory's number of labels (config.json's id2label), so that its classifier loads.
std::int64_t labels_of(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  const auto config = nlohmann::json::parse(in, nullptr, false);
  if (config.is_object() && config.contains("id2label") && config["id2label"].is_object()) {
    return static_cast<std::int64_t>(config["id2label"].size());
  }
  return 2;  // transformers' default
}

void BM_BertLoad(benchmark::State& state) {
  const std::string dtype = state.range(0) == 0 ? "float32" : "bfloat16";
  const auto section =
      trainer::Config::parse("name = \"bert\"\npath = \"" + bert_dir() + "\"\ndtype = \"" + dtype + "\"\n");
  const std::int64_t labels = labels_of(bert_dir());
  double rise_mib = 0, anon_mib = 0, model_mib = 0;
  for (auto _ : state) {
    const double before = status_kb("VmRSS"), anon_before = status_kb("RssAnon");
    if (!reset_peak()) {
      state.SkipWithError("/proc/self/clear_refs does not reset VmHWM here");
      break;
    }
    auto model = trainer::build_model(section, trainer::DataSpec{{3, 128}, labels});
    state.PauseTiming();
    rise_mib = (status_kb("VmHWM") - before) / 1024;
    anon_mib = (status_kb("RssAnon") - anon_before) / 1024;
    double bytes = 0;
    for (const auto& p : model->parameters()) bytes += static_cast<double>(p.nbytes());
    for (const auto& b : model->buffers()) bytes += static_cast<double>(b.nbytes());
    model_mib = bytes / (1 << 20);
    model.reset();
    state.ResumeTiming();
  }
  state.counters["model_MiB"] = model_mib;
  state.counters["rss_rise_MiB"] = rise_mib;
  state.counters["anon_MiB"] = anon_mib;
  state.counters["rise_per_model"] = model_mib > 0 ? rise_mib / model_mib : 0;
}

BENCHMARK(BM_BertLoad)
    ->ArgName("bf16")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)  // resident memory rises only in a fresh process: run it once per process
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
