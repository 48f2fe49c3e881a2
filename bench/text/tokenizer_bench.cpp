// Tokenizer throughput: trainer's tokenizers (tokenizer.json; SentencePiece) encoding the corpus the tokenizer tests
// use (tests/text/hf_tokenizers.py: 12,000 lines of Debian changelogs and licenses and 3,200
// hard ones), one thread, each line alone as a text and as a pair with the next, as the
// dataset "text" encodes them when it reads a file. bench/text/hf_tokenizer_speed.py times
// Hugging Face's tokenizers on the same lines; docs/benchmarks.md has both.
//
//   build/bench/tokenizer_bench [--benchmark_filter=...]
//   TRAINER_TOKENIZER_CORPUS=DIR: the fixture's directory (default: the build's)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/bench_smoke.h"
#include "text/tokenizer.h"

namespace {

std::string corpus_dir() {
  const char* dir = std::getenv("TRAINER_TOKENIZER_CORPUS");
  return dir && *dir ? dir : TRAINER_HF_TOKENIZERS;
}

const std::vector<std::string>& lines() {
  static const std::vector<std::string> all = [] {
    std::ifstream in(corpus_dir() + "/corpus.txt", std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    const std::string text = s.str();
    std::vector<std::string> out;
    for (std::size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1) {
      out.push_back(text.substr(at, end - at));
    }
    if (out.empty()) {
      std::fprintf(stderr, "tokenizer_bench: no %s/corpus.txt: run the fixture first (ctest -R hf_tokenizers)\n",
                   corpus_dir().c_str());
      std::exit(1);
    }
    if (trainer::bench::smoke() && out.size() > 200) out.resize(200);
    return out;
  }();
  return all;
}

void BM_Encode(benchmark::State& state, const std::string& name, bool pairs) {
  // The fixture's directory: its tokenizer.json, or its SentencePiece model (albert, t5).
  const auto tok = trainer::text::Tokenizer::from_path(corpus_dir() + "/" + name);
  const auto& text = lines();
  std::int64_t bytes = 0, tokens = 0;
  for (auto _ : state) {
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto e =
          pairs && i + 1 < text.size() ? tok.encode(text[i], std::string_view(text[i + 1])) : tok.encode(text[i]);
      tokens += static_cast<std::int64_t>(e.ids.size());
      bytes += static_cast<std::int64_t>(text[i].size() + (pairs && i + 1 < text.size() ? text[i + 1].size() : 0));
      benchmark::DoNotOptimize(e.ids.data());
    }
  }
  state.counters["lines/s"] =
      benchmark::Counter(static_cast<double>(text.size() * state.iterations()), benchmark::Counter::kIsRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(bytes);
}

BENCHMARK_CAPTURE(BM_Encode, bert_uncased, std::string("bert_uncased"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, bert_uncased_pairs, std::string("bert_uncased"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, roberta, std::string("roberta"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, roberta_pairs, std::string("roberta"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, albert, std::string("albert"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, t5, std::string("t5"), false)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
