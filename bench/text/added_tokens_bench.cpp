// Added-token matching: a text split at N added tokens of N different lengths ("<x>", "<xx>", ...),
// by trainer's matching (an automaton of the tokens written backwards: linear in the text) and,
// beside it, by the matching it replaced (each length looked up at each position: the text's
// bytes times the tokens' lengths), kept here only to be compared. ns/char is the time per byte
// of the text.
//
//   build/bench/added_tokens_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "support/bench_smoke.h"
#include "text/added_tokens.h"

namespace {

using trainer::text::detail::AddedToken;
using trainer::text::detail::AddedTokens;
using trainer::text::detail::Segment;

std::vector<std::string> tag_tokens(std::int64_t lengths) {
  std::vector<std::string> out;
  for (std::int64_t k = 1; k <= lengths; ++k) out.push_back("<" + std::string(static_cast<std::size_t>(k), 'x') + ">");
  return out;
}

/// About 20 kB of text with a few of the tokens in it (4 kB in a smoke run).
const std::string& text() {
  static const std::string t = [] {
    std::string s;
    const std::size_t size = trainer::bench::full_or_smoke<std::size_t>(20000, 4000);
    while (s.size() < size) s += "A changelog line, with <x> and <xxx> tokens among its words. ";
    return s;
  }();
  return t;
}

/// The matching before: the tokens by length, longest first; at each position of the text,
/// every length looked up, until a position matches.
class ByLength {
 public:
  explicit ByLength(const std::vector<std::string>& contents) {
    for (std::size_t i = 0; i < contents.size(); ++i) by_length_[contents[i].size()].emplace(contents[i], i);
  }
  void split(const std::string& s, std::vector<Segment>& out) const {
    std::size_t done = 0;
    for (std::size_t at = 0; at < s.size();) {
      const std::size_t len = match(s, at);
      if (len == 0) {
        ++at;
        continue;
      }
      if (done < at) out.push_back({s.substr(done, at - done), -1});
      out.push_back({std::string(), 0});
      at = done = at + len;
    }
    if (done < s.size()) out.push_back({s.substr(done), -1});
  }

 private:
  std::size_t match(const std::string& s, std::size_t at) const {
    for (const auto& [len, table] : by_length_) {
      if (len > s.size() - at) continue;
      if (table.find(s.substr(at, len)) != table.end()) return len;
    }
    return 0;
  }
  std::map<std::size_t, std::unordered_map<std::string, std::size_t>, std::greater<>> by_length_;
};

void count_chars(benchmark::State& state) {
  // The inverse of a rate: seconds per byte, in ns.
  state.counters["ns/char"] =
      benchmark::Counter(static_cast<double>(text().size()) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_AddedTokens_Split(benchmark::State& state) {
  AddedTokens tokens;
  std::int64_t id = 0;
  for (const auto& c : tag_tokens(state.range(0))) tokens.add(AddedToken{c, id++, false, false, false});
  tokens.finish();
  for (auto _ : state) {
    std::vector<Segment> out;
    tokens.split(text(), out);
    benchmark::DoNotOptimize(out.data());
  }
  count_chars(state);
}

void BM_AddedTokens_SplitByLength(benchmark::State& state) {
  const ByLength tokens(tag_tokens(state.range(0)));
  for (auto _ : state) {
    std::vector<Segment> out;
    tokens.split(text(), out);
    benchmark::DoNotOptimize(out.data());
  }
  count_chars(state);
}

BENCHMARK(BM_AddedTokens_Split)->ArgName("lengths")->Arg(30)->Arg(3000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AddedTokens_SplitByLength)->ArgName("lengths")->Arg(30)->Arg(3000)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
