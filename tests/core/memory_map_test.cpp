// Where the memory went, in real runs on the CPU: the live memory by category at the step's
// events equals what the model implies, every byte is in one category, memory.jsonl records the
// step, and at a real out-of-memory error (the budget refusing an allocation) the category that
// holds the most is the one the test engineered to dominate.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "report.h"
#include "support/refusing_data.h"
#include "support/test_util.h"
#include "trainer/memory.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::read_file;
using testing::read_lines_of;

const c10::Device kMapDevice(c10::kCPU);

// An MLP with AdamW: parameters, gradients and optimizer state are exactly known.
constexpr const char* kMlpRecipe = R"(
[run]
seed = 5
[model]
name = "mlp"
hidden = [64, 32]
[dataset]
name = "synthetic"
size = 96
eval_size = 32
shape = [1, 8, 8]
[training]
epochs = 1
batch_size = 32
micro_batch_size = 16
[optim]
name = "adamw"
lr = 0.01
[eval]
every_epochs = 1
at_end = false
[metrics]
console = false
)";

// A CNN on 32×32 images: the feature maps the forward keeps for the backward of 64 samples
// (several MiB) outweigh its few thousand parameters.
constexpr const char* kCnnRecipe = R"(
[model]
name = "cnn"
channels = [32, 32]
hidden = 16
batch_norm = false
memory_format = "contiguous"
[dataset]
name = "synthetic"
size = 64
eval_size = 8
shape = [3, 32, 32]
[training]
epochs = 1
batch_size = 64
[optim]
name = "sgd"
lr = 0.01
[eval]
every_epochs = 0
at_end = false
[metrics]
console = false
)";

std::int64_t sum(const MemoryBreakdown& b) {
  std::int64_t s = 0;
  for (const std::int64_t v : b.bytes) s += v;
  return s;
}

std::int64_t bytes_of(const std::vector<at::Tensor>& ts) {
  std::int64_t n = 0;
  for (const auto& t : ts) n += static_cast<std::int64_t>(t.numel() * t.element_size());
  return n;
}

/// The breakdown at each event it listens to, per step; sums checked against allocated.
class BreakdownProbe final : public Plugin {
 public:
  std::string name() const override { return "breakdown_probe"; }
  std::vector<Event> events() const override {
    return {Event::FitStart, Event::AfterForward, Event::AfterBackward, Event::GradientsAccumulated,
            Event::BatchEnd, Event::EvalEnd,      Event::OutOfMemory};
  }
  void on_event(EventContext& ctx, Control&) override {
    const MemoryBreakdown b = memory_breakdown(ctx.device);
    sums_match = sums_match && sum(b) == b.allocated && b.allocated == memory_stats(ctx.device).allocated;
    at[{ctx.state.global_step, ctx.event}] = b;
    if (ctx.event == Event::FitStart) {
      params = bytes_of(ctx.model->parameters());
      buffers = bytes_of(ctx.model->buffers());
    }
    if (ctx.event == Event::OutOfMemory && ctx.oom->live) live_at_oom.push_back(*ctx.oom->live);
  }
  std::map<std::pair<std::int64_t, Event>, MemoryBreakdown> at;
  std::vector<MemoryBreakdown> live_at_oom;
  std::int64_t params = 0, buffers = 0;
  bool sums_match = true;
};

/// The live bytes of the point `point` ("start", "peak", "live", …) of a memory.jsonl line, by
/// name; "allocated" is the total.
std::map<std::string, std::int64_t> point_of(const std::string& line, const std::string& point) {
  std::map<std::string, std::int64_t> out;
  std::string key = "\"" + point + "\":{";
  auto at = line.find(key);
  if (at == std::string::npos) {  // a snapshot's JSON is spaced
    key = "\"" + point + "\": {";
    at = line.find(key);
  }
  if (at == std::string::npos) return out;
  const auto begin = at + key.size(), end = line.find('}', begin);
  const std::string body = line.substr(begin, end - begin);
  static const std::regex pair("\"([a-z_]+)\":(-?[0-9]+)");
  for (std::sregex_iterator it(body.begin(), body.end(), pair), stop; it != stop; ++it) {
    out[(*it)[1]] = std::stoll((*it)[2]);
  }
  return out;
}

std::int64_t categories_sum(const std::map<std::string, std::int64_t>& point) {
  std::int64_t s = 0;
  for (const auto& [name, bytes] : point) {
    if (name != "allocated" && name != "reserved") s += bytes;
  }
  return s;
}

class MemoryMap : public testing::TrainerTest {
 protected:
  void TearDown() override { set_memory_limit(kMapDevice, 0); }
};

TEST_F(MemoryMap, AStepsCategoriesAreWhatTheModelImplies) {
  auto probe = std::make_shared<BreakdownProbe>();
  const RunResult r = fit(kMlpRecipe, {}, "run", {probe});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(r.global_step, 3);
  EXPECT_TRUE(probe->sums_match);
  const std::int64_t P = probe->params;
  ASSERT_EQ(P, (64 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10) * 4);
  using C = MemoryCategory;
  const MemoryBreakdown& fit_start = probe->at.at({0, Event::FitStart});
  EXPECT_EQ(fit_start[C::Parameters], P + probe->buffers);
  EXPECT_EQ(fit_start[C::Gradients], 0);
  EXPECT_EQ(fit_start[C::OptimizerState], 0);
  EXPECT_EQ(fit_start[C::Activations], 0);
  // The data sets: 96 + 32 samples of 64 floats, and their int64 labels.
  EXPECT_EQ(fit_start[C::Dataset], (96 + 32) * (64 * 4 + 8));
  for (std::int64_t step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    // The forward kept its activations for the backward.
    EXPECT_GT(probe->at.at({step, Event::AfterForward})[C::Activations], 0);
    // After the backward of both micro-batches: the gradients are the parameters' size and the
    // activations are gone.
    const MemoryBreakdown& accumulated = probe->at.at({step, Event::GradientsAccumulated});
    EXPECT_EQ(accumulated[C::Gradients], P);
    EXPECT_EQ(accumulated[C::Activations], 0);
    EXPECT_EQ(accumulated[C::Parameters], P + probe->buffers);
    // After the step: AdamW's two moments per parameter; the batch is released.
    const MemoryBreakdown& end = probe->at.at({step + 1, Event::BatchEnd});
    EXPECT_EQ(end[C::OptimizerState], 2 * P);
    EXPECT_EQ(end[C::Gradients], P);
    EXPECT_EQ(end[C::Activations], 0);
    EXPECT_EQ(end[C::Evaluation], 0);
  }
  // memory.jsonl: one line per step, and one for the evaluation; each point's categories sum to its total.
  const auto lines = read_lines_of(read_file(tmp_ / "run/memory.jsonl"));
  ASSERT_EQ(lines.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(lines[i]);
    EXPECT_NE(lines[i].find("\"kind\":\"step\",\"step\":" + std::to_string(i + 1)), std::string::npos);
    EXPECT_NE(lines[i].find("\"micro_batch\":16"), std::string::npos);
    for (const char* point : {"start", "forward", "backward", "optimizer_step", "peak"}) {
      const auto p = point_of(lines[i], point);
      ASSERT_TRUE(p.count("allocated")) << point;
      EXPECT_EQ(categories_sum(p), p.at("allocated")) << point;
    }
    EXPECT_EQ(point_of(lines[i], "optimizer_step").at("optimizer_state"), 2 * P);
    EXPECT_EQ(point_of(lines[i], "backward").at("gradients"), P);
    // The step's highest point is above each sampled one.
    EXPECT_GE(point_of(lines[i], "peak").at("allocated"), point_of(lines[i], "forward").at("allocated"));
  }
  EXPECT_NE(lines[3].find("\"kind\":\"eval\",\"step\":3"), std::string::npos) << lines[3];
  EXPECT_GT(point_of(lines[3], "peak").at("evaluation"), 0);
}

/// Sets the budget to what is in use plus 1 KiB at `at` of step `step`, so that the next
/// allocation is refused; lifts it at OutOfMemory and asks for the same micro-batch again.
class Tighten final : public Plugin {
 public:
  Tighten(Event at, std::int64_t step) : at_(at), step_(step) {}
  std::string name() const override { return "tighten"; }
  std::vector<Event> events() const override { return {at_, Event::OutOfMemory}; }
  int default_priority() const override { return 10; }  // after the probe
  void on_event(EventContext& ctx, Control& c) override {
    if (ctx.event == Event::OutOfMemory) {
      set_memory_limit(kMapDevice, 0);
      c.retry_with_micro_batch = ctx.oom->micro_batch_size;
      return;
    }
    if (done_ || ctx.state.global_step != step_) return;
    done_ = true;
    set_memory_limit(kMapDevice, memory_stats(kMapDevice).allocated + 1024);
  }

 private:
  Event at_;
  std::int64_t step_;
  bool done_ = false;
};

TEST_F(MemoryMap, AtAnOutOfMemoryErrorTheDominantCategoryIsNamed) {
  struct Case {
    std::string what, recipe_extra, phase;
    Event at;
    std::int64_t step;
    MemoryCategory dominant;
  };
  const std::vector<Case> cases = {
      // The CNN: the backward's first allocation is refused while the feature maps are all live.
      {"activations", kCnnRecipe, "backward", Event::BeforeBackward, 0, MemoryCategory::Activations},
      // A wide MLP on tiny inputs with AdamW, one sample a step: at the second step's optimizer
      // step, the two moments per parameter outweigh the parameters and the gradients.
      {"optimizer state", R"(
[model]
name = "mlp"
hidden = [512, 512]
[dataset]
name = "synthetic"
size = 4
eval_size = 2
shape = [1, 4, 4]
[training]
epochs = 1
batch_size = 1
[optim]
name = "adamw"
lr = 0.01
[eval]
every_epochs = 0
at_end = false
[metrics]
console = false
)",
       "optimizer_step", Event::BeforeOptimizerStep, 1, MemoryCategory::OptimizerState},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto probe = std::make_shared<BreakdownProbe>();
    auto tighten = std::make_shared<Tighten>(c.at, c.step);
    auto o = options_for(c.recipe_extra, {}, c.what == "activations" ? "act" : "opt", {probe, tighten});
    o.log_level = "info";
    Trainer t(std::move(o));
    const RunResult r = t.fit();
    ASSERT_EQ(r.exit_code, kExitOk) << r.message;
    ASSERT_EQ(probe->live_at_oom.size(), 1u);
    const MemoryBreakdown& live = probe->live_at_oom[0];
    EXPECT_EQ(live.largest(), c.dominant) << largest_category_text(live);
    EXPECT_EQ(sum(live), live.allocated);
    EXPECT_TRUE(probe->sums_match);
    const std::string dir = tmp_ / (c.what == "activations" ? "act" : "opt");
    // The log line names it, and memory.jsonl has the out-of-memory line with what was live.
    const std::string log = read_file(dir + "/trainer.log");
    EXPECT_NE(log.find("out of memory in " + c.phase + " (micro-batch"), std::string::npos) << log;
    EXPECT_NE(log.find("live then: " + std::string(memory_category_name(c.dominant))), std::string::npos) << log;
    std::string oom_line;
    for (const auto& line : read_lines_of(read_file(dir + "/memory.jsonl"))) {
      if (line.find("\"kind\":\"oom\"") != std::string::npos) oom_line = line;
    }
    ASSERT_FALSE(oom_line.empty());
    EXPECT_NE(oom_line.find("\"phase\":\"" + c.phase + "\""), std::string::npos) << oom_line;
    const auto jl = point_of(oom_line, "live");
    EXPECT_EQ(jl.at("allocated"), live.allocated);
    EXPECT_EQ(jl.at(memory_category_name(c.dominant)), live[c.dominant]);
    EXPECT_EQ(categories_sum(jl), jl.at("allocated"));
    // The snapshot: named by step, phase and attempt; the log line points to it.
    const std::string name = "memory/oom-0000000" + std::to_string(c.step) + "-" + c.phase + "-01.json";
    EXPECT_NE(log.find("; snapshot " + name), std::string::npos) << log;
    const std::string snap = read_file(dir + "/" + name);
    ASSERT_FALSE(snap.empty()) << name;
    EXPECT_NE(snap.find("\"phase\": \"" + c.phase + "\""), std::string::npos) << snap;
    EXPECT_NE(snap.find("\"largest_category\": \"" + std::string(memory_category_name(c.dominant)) + "\""),
              std::string::npos)
        << snap;
    EXPECT_NE(snap.find("\"allocated\": " + std::to_string(live.allocated)), std::string::npos) << snap;
    const auto categories = point_of(snap, "categories");
    EXPECT_EQ(categories_sum(categories), live.allocated);
    // `trainer report` reads what the run wrote: a point per optimizer step, the error, the snapshot.
    const report::RunData page = report::read_run(dir);
    EXPECT_EQ(page.memory_bad_lines, 0u);
    EXPECT_EQ(page.memory_steps.size(), static_cast<std::size_t>(r.global_step));
    ASSERT_EQ(page.memory_ooms.size(), 1u);
    EXPECT_EQ(page.memory_ooms[0].phase, c.phase);
    ASSERT_EQ(page.snapshots.size(), 1u);
    EXPECT_EQ(page.snapshots[0].largest_category, memory_category_name(c.dominant));
    EXPECT_EQ(page.snapshots[0].allocated, static_cast<double>(live.allocated));
    EXPECT_NE(report::render_html(page).find("<h2>Memory by category</h2>"), std::string::npos);
    // The largest allocations, largest first; in the activations case the largest of all is a
    // feature map the forward kept.
    static const std::regex block("\\{\"size\": ([0-9]+), \"category\": \"([a-z_]+)\", \"phase\": \"([a-z_]*)\"");
    std::vector<std::int64_t> sizes;
    std::vector<std::string> categories_of, phases_of;
    for (std::sregex_iterator it(snap.begin(), snap.end(), block), stop; it != stop; ++it) {
      sizes.push_back(std::stoll((*it)[1]));
      categories_of.push_back((*it)[2]);
      phases_of.push_back((*it)[3]);
    }
    ASSERT_FALSE(sizes.empty()) << snap;
    EXPECT_TRUE(std::is_sorted(sizes.rbegin(), sizes.rend())) << snap;
    if (c.dominant == MemoryCategory::Activations) {
      EXPECT_EQ(categories_of[0], "activations") << snap;
      EXPECT_EQ(phases_of[0], "forward") << snap;
    } else {
      // The four largest are the 512×512 layer's weight, AdamW's two moments of it (created at
      // the first optimizer step) and its gradient (this step's backward): equal sizes, oldest first.
      ASSERT_GE(sizes.size(), 4u);
      EXPECT_EQ(std::vector<std::string>(categories_of.begin(), categories_of.begin() + 4),
                (std::vector<std::string>{"parameters", "optimizer_state", "optimizer_state", "gradients"}))
          << snap;
      EXPECT_EQ(std::vector<std::string>(phases_of.begin(), phases_of.begin() + 4),
                (std::vector<std::string>{"", "optimizer_step", "optimizer_step", "backward"}))
          << snap;
      EXPECT_EQ(sizes[3], 512 * 512 * 4);
    }
  }
}

/// At an out-of-memory error at the backward of the first step, asks for half the micro-batch.
class HalveAtBackward final : public Plugin {
 public:
  std::string name() const override { return "halve_at_backward"; }
  std::vector<Event> events() const override { return {Event::BeforeBackward, Event::OutOfMemory}; }
  void on_event(EventContext& ctx, Control& c) override {
    if (ctx.event == Event::OutOfMemory) {
      set_memory_limit(kMapDevice, 0);
      if (ctx.oom->live) live = *ctx.oom->live;
      c.retry_with_micro_batch = ctx.oom->micro_batch_size / 2;
      return;
    }
    if (done_) return;
    done_ = true;
    set_memory_limit(kMapDevice, memory_stats(kMapDevice).allocated + 1024);
  }
  MemoryBreakdown live;

 private:
  bool done_ = false;
};

TEST_F(MemoryMap, AfterARetryTheStepsPointsAreTheRetrys) {
  // The CNN of the activations case: 64 samples' feature maps are live when its backward is
  // refused; the retry runs two micro-batches of 32, each keeping about half of them.
  auto halve = std::make_shared<HalveAtBackward>();
  const auto r = fit(kCnnRecipe, {}, "halved", {halve});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  const std::int64_t failed = halve->live[MemoryCategory::Activations];
  ASSERT_GT(failed, 0);
  std::string step;
  for (const auto& line : read_lines_of(read_file(tmp_ / "halved/memory.jsonl"))) {
    if (line.find("\"kind\":\"step\"") != std::string::npos) step = line;
  }
  ASSERT_FALSE(step.empty());
  EXPECT_NE(step.find("\"micro_batch\":32"), std::string::npos) << step;
  // The forward point is a micro-batch of 32's (the failed attempt's 64 are forgotten), and so
  // is the peak: both well under what the failed attempt held.
  EXPECT_LT(point_of(step, "forward").at("activations"), failed * 3 / 4) << step;
  EXPECT_LT(point_of(step, "peak").at("activations"), failed * 3 / 4) << step;
  EXPECT_GT(point_of(step, "forward").at("activations"), failed / 4) << step;
}

TEST_F(MemoryMap, ASkippedBatchWritesNoStepLine) {
  // A plugin skips the second batch: two optimizer steps, one line each.
  class SkipSecond final : public Plugin {
   public:
    std::string name() const override { return "skip_second"; }
    std::vector<Event> events() const override { return {Event::BatchStart}; }
    void on_event(EventContext& ctx, Control& c) override { c.skip_step = ctx.state.batch_in_epoch == 1; }
  };
  const auto r = fit(kMlpRecipe, {"eval.every_epochs=0"}, "skipped", {std::make_shared<SkipSecond>()});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(r.global_step, 2);
  const auto lines = read_lines_of(read_file(tmp_ / "skipped/memory.jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("\"step\":1,"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("\"step\":2,"), std::string::npos) << lines[1];
}

TEST_F(MemoryMap, AResumedRunAppendsAfterALineTheKilledRunLeftUnfinished) {
  const std::vector<std::string> keys = {"eval.every_epochs=0", "checkpoint.every_steps=1"};
  auto first = keys;
  first.push_back("training.max_steps=2");
  ASSERT_EQ(fit(kMlpRecipe, first, "run").exit_code, kExitOk);
  const std::string path = tmp_ / "run/memory.jsonl";
  ASSERT_EQ(read_lines_of(read_file(path)).size(), 2u);
  {
    std::ofstream cut(path, std::ios::app);
    cut << "{\"kind\":\"step\",\"step\":3,\"ep";  // a line the killed run did not finish
  }
  TrainerOptions o = options_for(kMlpRecipe, keys, "ignored");
  o.run_dir.clear();
  o.resume = tmp_ / "run";
  const RunResult r = Trainer(std::move(o)).fit();
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(r.global_step, 3);
  const auto lines = read_lines_of(read_file(path));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[2], "{\"kind\":\"step\",\"step\":3,\"ep");
  EXPECT_EQ(lines[3].rfind("{\"kind\":\"step\",\"step\":3,\"epoch\":0,", 0), 0u) << lines[3];
  EXPECT_EQ(lines[3].back(), '}') << lines[3];
}

TEST_F(MemoryMap, AMemoryJsonlThatIsALinkIsNotWrittenThrough) {
  // A run directory is untrusted: a memory.jsonl planted as a link to another file (or a FIFO,
  // which would block) is not opened; the run goes on without its timeline, and says so.
  const std::vector<std::string> keys = {"eval.every_epochs=0", "checkpoint.every_steps=1"};
  auto first = keys;
  first.push_back("training.max_steps=2");
  ASSERT_EQ(fit(kMlpRecipe, first, "run").exit_code, kExitOk);
  const std::string outside = tmp_ / "outside.txt";
  testing::write_file(outside, "not the run's\n");
  std::filesystem::remove(tmp_ / "run/memory.jsonl");
  std::filesystem::create_symlink(outside, tmp_ / "run/memory.jsonl");
  TrainerOptions o = options_for(kMlpRecipe, keys, "ignored");
  o.run_dir.clear();
  o.resume = tmp_ / "run";
  o.log_level = "info";
  const RunResult r = Trainer(std::move(o)).fit();
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(read_file(outside), "not the run's\n");
  const std::string log = read_file(tmp_ / "run/trainer.log");
  EXPECT_NE(log.find("cannot write the memory timeline"), std::string::npos) << log;
}

TEST_F(MemoryMap, ALoaderWorkersRefusalIsReportedByTheStepThatReadsTheBatch) {
  // The split's second read (a batch the loader worker reads ahead; the set-up read the first)
  // asks for 128 MiB with 64 MiB left: far above what the step being trained meanwhile needs,
  // so only the worker is refused.
  testing::RefusingData::add("refusing_train", "synthetic", Split::Train, 2, std::int64_t{64} << 20,
                             std::int64_t{128} << 20);
  auto retry = std::make_shared<Tighten>(Event::Shutdown, -1);  // retries at the same size; never tightens
  auto o = options_for(kMlpRecipe, {"dataset.name=refusing_train", "loader.workers=1", "eval.every_epochs=0"}, "worker",
                       {retry});
  o.log_level = "info";
  const RunResult r = Trainer(std::move(o)).fit();
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(r.global_step, 3);
  const std::string log = read_file(tmp_ / "worker/trainer.log");
  // The step that asked for the batch reports the worker's refusal: what was live, the snapshot.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m,
                                std::regex("out of memory in data \\(micro-batch 16, attempt 1\\): .*; live then: "
                                           "[a-z_]+ [0-9]+ % of [^;]+; snapshot (memory/oom-[0-9]{8}-data-01\\.json)")))
      << log;
  const std::string name = m[1];
  const std::string snap = read_file(tmp_ / ("worker/" + name));
  EXPECT_NE(snap.find("\"requested\": " + std::to_string(std::int64_t{128} << 20) + ","), std::string::npos) << snap;
  EXPECT_EQ(categories_sum(point_of(snap, "categories")), std::stoll(snap.substr(snap.find("\"allocated\": ") + 13)));
}

TEST_F(MemoryMap, OnlyTheNewestSnapshotsAreKept) {
  // An out-of-memory error at the backward of each of five steps, two snapshots kept.
  class EveryStep final : public Plugin {
   public:
    std::string name() const override { return "every_step"; }
    std::vector<Event> events() const override { return {Event::BeforeBackward, Event::OutOfMemory}; }
    void on_event(EventContext& ctx, Control& c) override {
      if (ctx.event == Event::OutOfMemory) {
        set_memory_limit(kMapDevice, 0);
        c.retry_with_micro_batch = ctx.oom->micro_batch_size;
        return;
      }
      if (ctx.state.global_step == squeezed_) return;
      squeezed_ = ctx.state.global_step;
      set_memory_limit(kMapDevice, memory_stats(kMapDevice).allocated + 64);
    }

   private:
    std::int64_t squeezed_ = -1;
  };
  const auto r =
      fit(kMlpRecipe, {"training.batch_size=16", "dataset.size=80", "eval.every_epochs=0", "memory.snapshots=2"},
          "kept", {std::make_shared<EveryStep>()});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(tmp_ / "kept/memory")) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"oom-00000003-backward-01.json", "oom-00000003-backward-01.pickle",
                                             "oom-00000004-backward-01.json", "oom-00000004-backward-01.pickle"}));
  // With none kept, there is no directory.
  const auto none =
      fit(kMlpRecipe, {"training.batch_size=16", "dataset.size=32", "eval.every_epochs=0", "memory.snapshots=0"},
          "none", {std::make_shared<EveryStep>()});
  ASSERT_EQ(none.exit_code, kExitOk) << none.message;
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "none/memory"));
}

TEST_F(MemoryMap, OffMeansNoCategoriesAndNoFile) {
  auto r = fit(kMlpRecipe, {"memory.categories=false"}, "off");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "off/memory.jsonl"));
  // The run's setting is the run's: the process has categories on again.
  EXPECT_TRUE(has_memory_categories(kMapDevice));
  // So it is for a run refused while it sets its budget.
  r = fit(kMlpRecipe, {"memory.categories=false", "memory.limit_mb=100", "memory.fraction=0.5"}, "refused");
  EXPECT_EQ(r.exit_code, kExitUsage) << r.message;
  EXPECT_NE(r.message.find("memory.limit_mb and memory.fraction are both set"), std::string::npos) << r.message;
  EXPECT_TRUE(has_memory_categories(kMapDevice));
  r = fit(kMlpRecipe, {"memory.timeline_every=2"}, "every2");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  const auto lines = read_lines_of(read_file(tmp_ / "every2/memory.jsonl"));
  ASSERT_EQ(lines.size(), 2u);  // step 2 and the evaluation
  EXPECT_NE(lines[0].find("\"step\":2,"), std::string::npos) << lines[0];
}

TEST_F(MemoryMap, TheTimelineMovesAsideAtItsBound) {
  // 30 steps of one sample, 10 lines a file: memory.1.jsonl holds the 10 before the last 10…
  const auto r = fit(kMlpRecipe,
                     {"training.batch_size=1", "training.micro_batch_size=1", "dataset.size=30", "eval.every_epochs=0",
                      "memory.timeline_lines=10"},
                     "bounded");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  const auto newer = read_lines_of(read_file(tmp_ / "bounded/memory.jsonl"));
  const auto older = read_lines_of(read_file(tmp_ / "bounded/memory.1.jsonl"));
  ASSERT_EQ(newer.size(), 10u);
  ASSERT_EQ(older.size(), 10u);
  EXPECT_NE(older.front().find("\"step\":11,"), std::string::npos) << older.front();
  EXPECT_NE(newer.back().find("\"step\":30,"), std::string::npos) << newer.back();
}

}  // namespace
}  // namespace trainer
