// trainer's CUDA paths, run for real on a GPU by scripts/gpu-check.sh (label `cuda`).
//
// The tests parameterised by device run on the CPU too (through the memory budget), so every
// `make test` exercises their own logic and a GPU visit finds no bug in the test itself; their
// `cuda:0` instances, and the tests that only mean something on a GPU, skip where LibTorch
// sees no GPU (every CPU machine), and gpu-check.sh fails when any of them skipped there.
//
// Exactness on CUDA: cuDNN runs its deterministic algorithms without TF32 (cudnn.benchmark
// off), and cuBLAS without TF32, so that two runs with the same micro-batch split are
// bit-identical, as on the CPU, and runs with different splits differ only by fp32 summation
// order.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "support/inject_inf.h"
#include "support/sample_ledger.h"
#include "support/test_util.h"
#include "support/tiny_text.h"
#include "trainer/config.h"
#include "trainer/devices.h"
#include "trainer/lease.h"
#include "trainer/lora.h"
#include "trainer/memory.h"
#include "trainer/model.h"
#include "trainer/precision.h"
#include "trainer/run_records.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::InjectInf;
using testing::metric_by_step;
using testing::read_file;
using testing::SampleLedger;
using testing::write_file;

const c10::Device kCpu(c10::kCPU);
const c10::Device kCuda(c10::kCUDA, 0);

bool have_gpu() { return torch::cuda::is_available() && has_memory_backend(kCuda); }
constexpr const char* kNoGpu = "no GPU visible to this LibTorch (runs on a GPU machine: scripts/gpu-check.sh)";

void deterministic_kernels() {
  auto& ctx = at::globalContext();
  ctx.setBenchmarkCuDNN(false);
  ctx.setDeterministicCuDNN(true);
  ctx.setAllowTF32CuDNN(false);
  ctx.setAllowTF32CuBLAS(false);
}

/// Leaves `d` no memory to spare: the next allocation that needs more from it fails with a real
/// out-of-memory error. CPU: a budget of what is in use plus 1 KiB. CUDA: the caching
/// allocator's cache emptied, then a cap of what it holds from the device plus 1 KiB, so that
/// an allocation the free parts of its segments cannot serve needs a new segment and is refused.
void squeeze(const c10::Device& d) {
  if (d.is_cuda()) {
    clear_memory(d, true);
    set_memory_limit(d, memory_stats(d).reserved + 1024);
  } else {
    set_memory_limit(d, memory_stats(d).allocated + 1024);
  }
}

// A CNN without BatchNorm (accumulation is exact up to summation order) whose activations
// (micro-batch 64: 6.4 MB per conv1 output) and hidden layer (3136 x 1024: 12.8 MB) are large:
// on CUDA they need segments of their own, so a squeezed forward, backward or AdamW step (whose
// temporaries have the hidden layer's size) asks the device for more and is refused.
constexpr const char* kRecipe = R"(
[run]
seed = 11
[model]
name = "cnn"
channels = [32, 64]
hidden = 1024
batch_norm = false
dropout = 0.0
[dataset]
name = "synthetic"
size = 256
eval_size = 64
[training]
epochs = 1
batch_size = 64
micro_batch_size = 64
log_every = 1
[optim]
name = "adamw"
lr = 0.001
[eval]
every_epochs = 0
at_end = false
[metrics]
console = false
[plugins]
load = ["oom_backoff", "recording"]
)";

/// Squeezes the run's device at `at` (first attempt only) in the steps listed, lifts the cap at
/// OutOfMemory, and records each OOM's phase and the counters at every BatchEnd. With
/// `restore`, each batch starts again at the configured micro-batch (oom_backoff would
/// otherwise keep halving it, one OOM after the other).
class Squeeze final : public Plugin {
 public:
  Squeeze(Event at, std::set<std::int64_t> steps, bool restore = false)
      : at_(at), steps_(std::move(steps)), restore_(restore) {}
  std::string name() const override { return "squeeze"; }
  std::vector<Event> events() const override { return {at_, Event::OutOfMemory, Event::BatchStart, Event::BatchEnd}; }
  int default_priority() const override { return -10; }  // before oom_backoff
  void on_event(EventContext& ctx, Control& c) override {
    if (ctx.event == Event::OutOfMemory) {
      set_memory_limit(ctx.device, 0);
      phases.push_back(oom_phase_name(ctx.oom->phase));
      messages.push_back(ctx.oom->message);
      return;
    }
    if (ctx.event == Event::BatchStart) {
      attempted_ = false;
      if (configured_ == 0) configured_ = ctx.state.micro_batch_size;
      if (restore_) c.micro_batch_size = configured_;
    }
    if (ctx.event == Event::BatchEnd) {
      const MemoryStats s = memory_stats(ctx.device);
      allocated.push_back(s.allocated);
      reserved.push_back(s.reserved);
      num_ooms.push_back(s.num_ooms);
    }
    const bool per_micro = at_ == Event::BeforeForward || at_ == Event::BeforeBackward;
    if (ctx.event == at_ && !attempted_ && steps_.count(ctx.state.global_step) &&
        (!per_micro || ctx.state.micro_batch_index == 0)) {
      attempted_ = true;
      squeeze(ctx.device);
    }
  }
  std::vector<std::string> phases, messages;
  std::vector<std::int64_t> allocated, reserved, num_ooms;

 private:
  Event at_;
  std::set<std::int64_t> steps_;
  bool restore_ = false;
  bool attempted_ = false;
  std::int64_t configured_ = 0;
};

/// Where the model, its buffers and AdamW's state live at FitEnd, and how often the model moved.
class Whereabouts final : public Plugin {
 public:
  std::string name() const override { return "whereabouts"; }
  std::vector<Event> events() const override { return {Event::ModelToDevice, Event::FitEnd}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::ModelToDevice) {
      moves.push_back(ctx.device.str());
      return;
    }
    for (const auto& p : ctx.model->parameters()) devices.insert(p.device().str());
    for (const auto& b : ctx.model->buffers()) devices.insert(b.device().str());
    for (const auto& [key, state] : ctx.optimizer->state()) {
      if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
        devices.insert(s->exp_avg().device().str());
        devices.insert(s->exp_avg_sq().device().str());
        ++optimizer_states;
      }
    }
  }
  std::vector<std::string> moves;
  std::set<std::string> devices;
  int optimizer_states = 0;
};

class OnDevice : public testing::TrainerTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    TrainerTest::SetUp();
    device_ = c10::Device(GetParam());
    if (device_.is_cuda() && !have_gpu()) GTEST_SKIP() << kNoGpu;
    if (device_.is_cpu()) install_cpu_tracking_allocator();  // counts from the test's first tensor
    deterministic_kernels();
  }
  void TearDown() override {
    set_memory_limit(kCpu, 0);
    if (have_gpu()) set_memory_limit(kCuda, 0);
  }
  RunResult run(const std::string& name, std::vector<std::string> overrides,
                std::vector<std::shared_ptr<Plugin>> extra = {}, const std::string& recipe = kRecipe) {
    overrides.push_back("runtime.device=" + device_.str());
    TrainerOptions o = options_for(recipe, overrides, name, extra);
    o.log_level = log_level_;
    params_.clear();  // the last run's parameters (CPU copies) would count in this one's CPU memory
    Trainer t(std::move(o));
    RunResult r = t.fit();
    if (t.model()) {
      for (const auto& p : t.model()->parameters()) params_.push_back(p.detach().cpu().clone());
    }
    return r;
  }
  /// Runs that differ only in the micro-batch split sum the same fp32 products in another
  /// order: ~1e-7 relative per sum, ~1e-6 after four AdamW steps of lr 1e-3 on either device
  /// (TF32 off). A lost, doubled or stale gradient moves a parameter by the step size, 1e-3.
  void expect_params_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-5))
          << "param " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>();
    }
  }
  void expect_oom_count(std::int64_t counted, std::int64_t recoveries) const {
    if (device_.is_cuda()) {
      EXPECT_GE(counted, recoveries);
    } else {
      EXPECT_EQ(counted, recoveries);
    }
  }
  c10::Device device_ = kCpu;
  std::string log_level_ = "error";
  std::vector<at::Tensor> params_;
};

std::string device_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param == "cpu" ? "cpu" : "cuda0";
}

TEST_P(OnDevice, TheMemoryBackendCountsCapsAndClears) {
  clear_memory(device_, true);
  const MemoryStats before = memory_stats(device_);
  {
    auto t = torch::empty({16 << 20}, torch::TensorOptions().dtype(torch::kFloat).device(device_));  // 64 MiB
    const MemoryStats with = memory_stats(device_);
    EXPECT_GE(with.allocated - before.allocated, std::int64_t{64} << 20);
    EXPECT_GE(with.reserved, with.allocated);
    // A cap below what the next tensor needs refuses it with a real out-of-memory error.
    set_memory_limit(device_, with.reserved + (std::int64_t{1} << 20));
    EXPECT_EQ(memory_stats(device_).limit, with.reserved + (std::int64_t{1} << 20));
    try {
      auto big = torch::empty({16 << 20}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
      ADD_FAILURE() << "64 MiB allocated past a cap of 1 MiB more than in use";
    } catch (const std::exception& e) {
      EXPECT_TRUE(is_out_of_memory(e)) << e.what();
    }
    EXPECT_EQ(memory_stats(device_).num_ooms, with.num_ooms + 1);
    set_memory_limit(device_, 0);
    EXPECT_EQ(memory_stats(device_).limit, 0);
    EXPECT_NO_THROW(torch::empty({16 << 20}, torch::TensorOptions().dtype(torch::kFloat).device(device_)));
  }
  // What the freed tensors held goes back (CUDA: emptyCache gives the cached segments back).
  clear_memory(device_, true);
  const MemoryStats after = memory_stats(device_);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_LE(after.reserved, before.reserved + (std::int64_t{2} << 20));
}

TEST_P(OnDevice, TheRunsMemoryLimitIsInForceDuringTheRunAndEndsWithIt) {
  class LimitProbe final : public Plugin {
   public:
    std::string name() const override { return "limit_probe"; }
    std::vector<Event> events() const override { return {Event::BatchEnd}; }
    void on_event(EventContext& ctx, Control&) override { limits.push_back(memory_stats(ctx.device).limit); }
    std::vector<std::int64_t> limits;
  };
  auto probe = std::make_shared<LimitProbe>();
  const RunResult r = run("run", {"+memory.limit_mb=2048"}, {probe});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(probe->limits.size(), 4u);
  // CUDA keeps the cap as a fraction of the device's total: within a byte of 2 GiB.
  for (auto l : probe->limits) EXPECT_NEAR(static_cast<double>(l), static_cast<double>(std::int64_t{2048} << 20), 1.0);
  EXPECT_EQ(memory_stats(device_).limit, 0);
}

TEST_P(OnDevice, OutOfMemoryInTheForwardTheBackwardAndTheStepIsRecoveredWithTheSameSamplesAndResult) {
  fix_threads();
  auto clean_ledger = std::make_shared<SampleLedger>();
  ASSERT_EQ(run("clean", {}, {clean_ledger}).exit_code, kExitOk);
  const auto reference = params_;
  ASSERT_EQ(clean_ledger->steps.size(), 4u);
  for (const auto& [event, phase] :
       std::vector<std::pair<Event, std::string>>{{Event::BeforeForward, "forward"},
                                                  {Event::BeforeBackward, "backward"},
                                                  {Event::BeforeOptimizerStep, "optimizer_step"}}) {
    SCOPED_TRACE(phase);
    // Each squeezed batch starts at micro-batch 64 again, so that the second squeeze meets the
    // same sizes as the first (at 32, a CUDA forward may fit in what the segments have left).
    auto squeeze = std::make_shared<Squeeze>(event, std::set<std::int64_t>{1, 2}, true);
    auto ledger = std::make_shared<SampleLedger>();
    const RunResult r = run(phase, {}, {squeeze, ledger});
    ASSERT_EQ(r.exit_code, kExitOk) << r.message;
    EXPECT_EQ(r.global_step, 4);
    EXPECT_EQ(squeeze->phases, (std::vector<std::string>{phase, phase}));
    for (const auto& m : squeeze->messages) EXPECT_NE(m.find("out of memory"), std::string::npos) << m;
    // The same samples in the same order, 64 to every step: the effective batch is kept.
    EXPECT_EQ(ledger->steps, clean_ledger->steps);
    // Two real out-of-memory errors counted by the device's allocator (CUDA: at least two, as
    // cuDNN catches a refused workspace and tries another algorithm, and each refusal counts).
    ASSERT_EQ(squeeze->num_ooms.size(), 4u);
    expect_oom_count(squeeze->num_ooms.back() - squeeze->num_ooms.front(), 2);
    expect_params_close(params_, reference);
  }
}

TEST_P(OnDevice, TwentyRecoveriesLeaveNoMemoryBehind) {
  fix_threads();
  std::string recipe = kRecipe;
  const std::string size = "size = 256";
  recipe.replace(recipe.find(size), size.size(), "size = 1344");  // 21 steps
  auto clean = std::make_shared<Squeeze>(Event::BeforeForward, std::set<std::int64_t>{});
  ASSERT_EQ(run("clean", {}, {clean}, recipe).exit_code, kExitOk);
  std::set<std::int64_t> steps;
  for (std::int64_t s = 1; s <= 20; ++s) steps.insert(s);
  auto squeeze = std::make_shared<Squeeze>(Event::BeforeForward, steps, true);
  const RunResult r = run("oom", {}, {squeeze}, recipe);
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(squeeze->phases.size(), 20u);
  ASSERT_EQ(squeeze->allocated.size(), 21u);
  expect_oom_count(squeeze->num_ooms.back() - squeeze->num_ooms.front(), 20);
  // After each recovery the memory in use is back where step 0 left it. What the allocator
  // holds does not grow: on the CPU never more than the run without errors held; on CUDA at
  // most one large segment (20 MiB) more than after the first recovery, as a retry after the
  // cache was emptied may spread its blocks over one more segment; a leak of one activation
  // per recovery would add 20 x 6 MiB.
  const std::int64_t most = *std::max_element(clean->reserved.begin(), clean->reserved.end());
  for (std::size_t s = 1; s < 21; ++s) {
    EXPECT_EQ(squeeze->allocated[s], squeeze->allocated[0]) << s;
    if (device_.is_cuda()) {
      EXPECT_LE(squeeze->reserved[s], squeeze->reserved[1] + (std::int64_t{20} << 20)) << s;
    } else {
      EXPECT_LE(squeeze->reserved[s], most) << s;
    }
  }
}

TEST_P(OnDevice, TheDeviceGeneratorIsRestoredByAResume) {
  fix_threads();
  // Dropout draws from the run device's generator (CUDA: its Philox state): a resume that
  // did not restore it would draw other masks and the losses would differ.
  const std::vector<std::string> common = {"+model.dropout=0.2", "training.epochs=3", "training.batch_size=16",
                                           "training.micro_batch_size=16", "optim.name=adamw"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  ASSERT_EQ(run("straight", with({}), {}, testing::kSmallRun).exit_code, kExitOk);
  const auto straight = metric_by_step(tmp_ / "straight/metrics.jsonl", "train/loss");
  ASSERT_EQ(straight.size(), 12u);
  ASSERT_EQ(run("part", with({"training.max_steps=6"}), {}, testing::kSmallRun).exit_code, kExitOk);
  TrainerOptions o = options_for(testing::kSmallRun, with({"runtime.device=" + device_.str()}), "resumed");
  o.resume = tmp_ / "part";
  o.log_level = "error";
  ASSERT_EQ(Trainer(std::move(o)).fit().exit_code, kExitOk);
  const auto resumed = metric_by_step(tmp_ / "resumed/metrics.jsonl", "train/loss");
  ASSERT_EQ(resumed.size(), 6u);
  for (const auto& [step, loss] : resumed) {
    ASSERT_TRUE(straight.count(step)) << step;
    EXPECT_DOUBLE_EQ(loss, straight.at(step)) << "step " << step;
  }
}

/// The live bytes by category at the events the test reads, and what each out-of-memory error
/// reported as live.
class CategoryProbe final : public Plugin {
 public:
  std::string name() const override { return "category_probe"; }
  std::vector<Event> events() const override {
    return {Event::FitStart, Event::AfterForward, Event::GradientsAccumulated, Event::BatchEnd, Event::OutOfMemory};
  }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::OutOfMemory) {
      if (ctx.oom->live) live_at_oom.push_back(*ctx.oom->live);
      return;
    }
    const MemoryBreakdown b = memory_breakdown(ctx.device);
    std::int64_t sum = 0;
    for (const std::int64_t bytes : b.bytes) sum += bytes;
    // The categories sum to the breakdown's total, which is what the allocator counts (CPU) or
    // at most that (CUDA: its blocks can be larger than the rounded requests counted here).
    sums_match = sums_match && sum == b.allocated && b.reserved >= b.allocated;
    const std::int64_t counted = memory_stats(ctx.device).allocated;
    within_allocated = within_allocated && (ctx.device.is_cuda() ? b.allocated <= counted : b.allocated == counted);
    at[{ctx.state.global_step, ctx.event}] = b;
    if (ctx.event == Event::FitStart) {
      // Each parameter's bytes as its device's allocator counts them: CUDA rounds each request up
      // to a multiple of 512 bytes; the CPU's tracking allocator counts them exactly.
      for (const auto& p : ctx.model->parameters()) {
        const auto n = static_cast<std::int64_t>(p.numel() * p.element_size());
        params += ctx.device.is_cuda() ? std::max<std::int64_t>(512, (n + 511) / 512 * 512) : n;
      }
      buffers = static_cast<std::int64_t>(ctx.model->buffers().size());
    }
  }
  std::map<std::pair<std::int64_t, Event>, MemoryBreakdown> at;
  std::vector<MemoryBreakdown> live_at_oom;
  std::int64_t params = 0, buffers = 0;
  bool sums_match = true, within_allocated = true;
};

/// The number in `"key": N` (or `"key":N`) of a snapshot's JSON, its first; -1 when absent.
std::int64_t json_number(const std::string& text, const std::string& key) {
  const auto at = text.find("\"" + key + "\":");
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + key.size() + 3);
}

TEST_P(OnDevice, TheLiveMemoryIsSplitByCategoryAndAnOutOfMemoryErrorLeavesASnapshot) {
  // The CNN (no buffers), AdamW: after each step's backward the gradients are the parameters'
  // size and no activation is left; after its optimizer step AdamW's two moments are twice it.
  // At step 1 the device is squeezed before the backward: a real out-of-memory error there
  // (CUDA: on the autograd engine's device thread) leaves a snapshot of what was live.
  auto probe = std::make_shared<CategoryProbe>();
  auto squeeze = std::make_shared<Squeeze>(Event::BeforeBackward, std::set<std::int64_t>{1}, true);
  log_level_ = "warn";  // the out-of-memory warning names the snapshot
  const RunResult r = run("map", {}, {probe, squeeze});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  ASSERT_EQ(r.global_step, 4);
  ASSERT_EQ(squeeze->phases, std::vector<std::string>{"backward"});
  EXPECT_TRUE(probe->sums_match);
  EXPECT_TRUE(probe->within_allocated);
  ASSERT_EQ(probe->buffers, 0);
  const std::int64_t P = probe->params;
  using C = MemoryCategory;
  const MemoryBreakdown& start = probe->at.at({0, Event::FitStart});
  EXPECT_EQ(start[C::Parameters], P);
  EXPECT_EQ(start[C::Gradients], 0);
  EXPECT_EQ(start[C::OptimizerState], 0);
  EXPECT_EQ(start[C::Activations], 0);
  for (std::int64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    EXPECT_GT(probe->at.at({step, Event::AfterForward})[C::Activations], 0);
    // The micro-batch on the device (CUDA: its copy there; CPU: the loader's) is the batch's.
    EXPECT_GT(probe->at.at({step, Event::AfterForward})[C::Batch], 0);
    const MemoryBreakdown& accumulated = probe->at.at({step, Event::GradientsAccumulated});
    EXPECT_EQ(accumulated[C::Parameters], P);
    EXPECT_EQ(accumulated[C::Gradients], P);
    EXPECT_EQ(accumulated[C::Activations], 0);
    const MemoryBreakdown& end = probe->at.at({step + 1, Event::BatchEnd});
    EXPECT_EQ(end[C::OptimizerState], 2 * P);
    EXPECT_EQ(end[C::Gradients], P);
    EXPECT_EQ(end[C::Activations], 0);
  }
  // What was live at the refusal: the parameters, AdamW's state, and the forward's activations.
  ASSERT_EQ(probe->live_at_oom.size(), 1u);
  const MemoryBreakdown& live = probe->live_at_oom[0];
  EXPECT_EQ(live[C::Parameters], P);
  EXPECT_EQ(live[C::OptimizerState], 2 * P);
  EXPECT_GT(live[C::Activations], 0);
  // The snapshot beside the run, named by step, phase and attempt, and the log line pointing to it.
  const std::string dir = tmp_ / "map";
  const std::string name = "memory/oom-00000001-backward-01";
  const std::string json = read_file(dir + "/" + name + ".json");
  ASSERT_FALSE(json.empty()) << name;
  EXPECT_NE(json.find("\"device\": \"" + device_.str() + "\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"phase\": \"backward\""), std::string::npos) << json;
  EXPECT_GT(json_number(json, "requested"), 0) << json;
  EXPECT_EQ(json_number(json, "allocated"), live.allocated) << json;
  EXPECT_EQ(json_number(json, "parameters"), P) << json;
  EXPECT_GT(json_number(json, "blocks"), 0) << json;
  // Blocks the backward allocated before the refusal carry its phase (CUDA: allocated on the
  // autograd engine's device thread, which takes the loop's tag).
  EXPECT_NE(json.find("\"phase\": \"backward\", \"serial\""), std::string::npos) << json;
  const std::string pickle = read_file(dir + "/" + name + ".pickle");
  ASSERT_GT(pickle.size(), 3u);
  EXPECT_EQ(pickle.substr(0, 3), "\x80\x02}");
  EXPECT_EQ(pickle.back(), '.');
  const std::string log = read_file(dir + "/trainer.log");
  EXPECT_NE(log.find("; snapshot " + name + ".json"), std::string::npos) << log;
  if (!device_.is_cuda()) return;
  // CUDA: the caching allocator's own snapshot, taken by its out-of-memory observer at the
  // refusal, beside it; PyTorch's viewer functions draw both.
  const std::string allocator = dir + "/" + name + ".allocator.pickle";
  const std::string own = read_file(allocator);
  ASSERT_GT(own.size(), 2u) << allocator;
  EXPECT_EQ(own[0], '\x80');
  EXPECT_EQ(own.back(), '.');
  // PyTorch reads both: ours has a segment per listed block with its phase and category as
  // frames; the allocator's lists its real segments, whose active blocks hold at least the
  // bytes the ledger counts. Its viewer functions make their pages of both.
  const std::string script = tmp_ / "viz.py";
  write_file(script,
             "import pickle, sys\n"
             "from torch.cuda import _memory_viz as viz\n"
             "ours = pickle.load(open(sys.argv[1], 'rb'))\n"
             "theirs = pickle.load(open(sys.argv[2], 'rb'))\n"
             "allocated, blocks = int(sys.argv[3]), int(sys.argv[4])\n"
             "assert len(ours['segments']) == blocks, (len(ours['segments']), blocks)\n"
             "names = {f['name'] for s in ours['segments'] for b in s['blocks'] for f in b.get('frames', [])}\n"
             "assert {'backward', 'parameters', 'optimizer_state'} <= names, names\n"
             "assert theirs['segments'], 'the allocator listed no segment'\n"
             "active = sum(b['size'] for s in theirs['segments'] for b in s['blocks']\n"
             "             if b['state'] == 'active_allocated')\n"
             "assert active >= allocated, (active, allocated)\n"
             "for page in (viz.segment_plot(ours), viz.trace_plot(ours), viz.segment_plot(theirs)):\n"
             "    assert '<script' in page.lower(), page[:200]\n"
             "print('read', len(theirs['segments']), 'segments', active, 'bytes active')\n");
  // The Python the build knows (TRAINER_TEST_PYTHON), else the machine's python3: the GPU
  // machine's has torch.
  std::string python;
  for (const std::string& candidate : {std::string(TRAINER_TEST_PYTHON), std::string("python3")}) {
    if (std::system((candidate + " -c 'import torch.cuda._memory_viz' > /dev/null 2>&1").c_str()) == 0) {
      python = candidate;
      break;
    }
  }
  ASSERT_FALSE(python.empty()) << "neither " << TRAINER_TEST_PYTHON << " nor python3 imports torch.cuda._memory_viz";
  const std::string out = tmp_ / "viz.out";
  const int rc = std::system((python + " " + script + " " + dir + "/" + name + ".pickle " + allocator + " " +
                              std::to_string(live.allocated) + " " + std::to_string(json_number(json, "blocks")) +
                              " > " + out + " 2>&1")
                                 .c_str());
  EXPECT_EQ(rc, 0) << python << " could not read the snapshots: " << read_file(out);
  EXPECT_NE(read_file(out).find("bytes active"), std::string::npos) << read_file(out);
}

INSTANTIATE_TEST_SUITE_P(Devices, OnDevice, ::testing::Values(std::string("cpu"), std::string("cuda:0")), device_name);

/// The GPU-only paths: each skips without a GPU.
class OnGpu : public testing::TrainerTest {
 protected:
  void SetUp() override {
    TrainerTest::SetUp();
    if (!have_gpu()) GTEST_SKIP() << kNoGpu;
    deterministic_kernels();
  }
  void TearDown() override {
    set_memory_limit(kCpu, 0);
    if (have_gpu()) set_memory_limit(kCuda, 0);
  }
  RunResult run(const std::string& name, const std::vector<std::string>& overrides,
                std::vector<std::shared_ptr<Plugin>> extra = {}, const std::string& log_level = "error") {
    TrainerOptions o = options_for(kRecipe, overrides, name, extra);
    o.log_level = log_level;
    Trainer t(std::move(o));
    return t.fit();
  }
};

/// Squeezes the GPU before every forward from step 1 on, so no micro-batch fits there.
class GpuAlwaysTight final : public Plugin {
 public:
  std::string name() const override { return "gpu_always_tight"; }
  std::vector<Event> events() const override { return {Event::BeforeForward, Event::OutOfMemory}; }
  int default_priority() const override { return -10; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::OutOfMemory) {
      if (ctx.device.is_cuda()) set_memory_limit(ctx.device, 0);
      return;
    }
    if (ctx.device.is_cuda() && ctx.state.global_step >= 1) squeeze(ctx.device);
  }
};

TEST_F(OnGpu, WhenBackingOffIsExhaustedTheRunMovesToTheCpuOnceAndFinishesThere) {
  auto where = std::make_shared<Whereabouts>();
  const RunResult r = run("run",
                          {"runtime.device=cuda:0", "+plugins.oom_backoff.min_micro_batch=32",
                           "+plugins.oom_backoff.fallback_devices=[\"cpu\"]"},
                          {std::make_shared<GpuAlwaysTight>(), where}, "info");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 4);
  EXPECT_EQ(where->moves, (std::vector<std::string>{"cuda:0", "cpu"}));
  EXPECT_EQ(where->devices, (std::set<std::string>{"cpu"}));  // parameters, buffers, AdamW's state
  EXPECT_GT(where->optimizer_states, 0);
  const std::string log = read_file(tmp_ / "run/trainer.log");
  EXPECT_NE(log.find("oom_backoff: cuda:0 exhausted at micro-batch 32, falling back to cpu"), std::string::npos) << log;
}

TEST_F(OnGpu, Bf16AndFp16AutocastTrainOnTheGpuAndTheScalerSkipsAnInfStep) {
  for (const std::string precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    auto inject = std::make_shared<InjectInf>(1);
    const RunResult r = run(precision,
                            {"runtime.device=cuda:0", "plugins.load=[\"mixed_precision\", \"recording\"]",
                             "+plugins.mixed_precision.precision=\"" + precision + "\"",
                             "+plugins.mixed_precision.grad_scaler=\"on\"", "+plugins.mixed_precision.init_scale=1024"},
                            {inject});
    ASSERT_EQ(r.status, RunStatus::Finished) << r.message;
    ASSERT_FALSE(inject->autocast.empty());
    for (const auto& s : inject->autocast) {
      EXPECT_TRUE(s.cuda_enabled);
      EXPECT_EQ(s.cuda_dtype, precision == "bf16" ? c10::kBFloat16 : c10::kHalf);
    }
    // The inf reached the scaler's CUDA unscale: the step was skipped, nothing changed, and
    // the scale halved.
    ASSERT_EQ(inject->before.size(), inject->after.size());
    ASSERT_FALSE(inject->before.empty());
    for (std::size_t i = 0; i < inject->before.size(); ++i)
      EXPECT_TRUE(torch::equal(inject->before[i], inject->after[i])) << "parameter " << i << " changed";
    EXPECT_EQ(r.global_step, 3);  // 4 batches, one step skipped
    EXPECT_EQ(r.final_metrics.at("amp/loss_scale"), 512.0);
    EXPECT_EQ(r.final_metrics.at("amp/skipped_steps"), 1.0);
    EXPECT_TRUE(std::isfinite(r.final_metrics.at("train/loss")));
  }
}

// A BERT-layout text classifier (2 layers of width 128, dynamic padding, token ids kept
// integers through the move to the GPU) trains on the GPU under bf16 autocast and under fp16
// with the GradScaler: the steps asked are taken (the scaler's skipped steps are not counted),
// the loss is finite, and the weights stay float32 on the GPU.
TEST_F(OnGpu, ATextModelTrainsUnderBf16AndFp16WithTheScaler) {
  const std::string recipe = testing::tiny_text_recipe(tmp_.str());
  const std::vector<std::string> common = {
      "runtime.device=cuda:0", "training.max_steps=6",          "training.log_every=1", "eval.every_epochs=0",
      "eval.at_end=false",     "plugins.load=[\"memory_log\"]", "metrics.console=false"};
  const auto fit_with = [&](const std::string& name, std::vector<std::string> more) {
    std::vector<std::string> o = common;
    o.insert(o.end(), more.begin(), more.end());
    TrainerOptions opts = options_for(recipe, o, name);
    Trainer t(std::move(opts));
    const RunResult r = t.fit();
    return std::pair{r, t.model()};
  };
  const auto [fp32, fp32_model] = fit_with("fp32", {});
  ASSERT_EQ(fp32.status, RunStatus::Finished) << fp32.message;
  EXPECT_EQ(fp32.global_step, 6);
  for (const std::string precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const auto [r, model] = fit_with(precision, {"plugins.load=[\"memory_log\", \"mixed_precision\"]",
                                                 "+plugins.mixed_precision.precision=\"" + precision + "\""});
    ASSERT_EQ(r.status, RunStatus::Finished) << r.message;
    EXPECT_TRUE(std::isfinite(r.final_metrics.at("train/loss")));
    EXPECT_EQ(r.global_step, 6);
    if (precision == "fp16") {
      EXPECT_GT(r.final_metrics.at("amp/loss_scale"), 0.0);
    }
    EXPECT_GT(r.final_metrics.at("memory/peak_mb"), 0.0);
    for (const auto& p : model->named_parameters()) {
      EXPECT_TRUE(p.value().device().is_cuda()) << p.key();
      EXPECT_EQ(p.value().scalar_type(), at::kFloat) << p.key();
    }
  }
}

/// At ModelCreated: where the model's parameters are, the set-up's peaks on the GPU and the
/// host so far (MemoryMonitor windows the test opened), and the model's weights, copied.
class AtModelCreated final : public Plugin {
 public:
  AtModelCreated(MemoryMonitor* gpu, MemoryMonitor* host) : gpu_(gpu), host_(host) {}
  std::string name() const override { return "at_model_created"; }
  std::vector<Event> events() const override { return {Event::ModelCreated}; }
  void on_event(EventContext& ctx, Control&) override {
    if (gpu_ != nullptr) gpu_peak = gpu_->peak_delta();
    if (host_ != nullptr) host_peak = host_->peak_delta();
    for (const auto& p : ctx.model->named_parameters()) {
      devices.insert(p.value().device().str());
      bytes += p.value().nbytes();
      weights[p.key()] = p.value().detach().cpu().clone();
    }
  }
  std::int64_t gpu_peak = -1, host_peak = -1, bytes = 0;
  std::set<std::string> devices;
  std::map<std::string, at::Tensor> weights;

 private:
  MemoryMonitor *gpu_, *host_;
};

// A BERT read from a directory (model.path) is built on the run's GPU and its file read into it
// there, 1 MiB at a time: in ModelCreated every parameter is on cuda:0 and holds the file's
// values, the GPU's peak so far is within 5 % of the model's bytes, and the host never held a
// copy: its peak over the set-up stays under a tenth of the model's bytes (82.8 M parameters,
// 331 MB; a build on the host moved afterwards would add 100 %, the tokenized data and the read
// buffer are about 3 MB). The new classifier head (the file's has 3 classes, the data 2) is
// drawn from the CPU generator, so it is the same as a run on the CPU gives for the seed.
TEST_F(OnGpu, ABertFromADirectoryIsReadStraightOntoTheGpu) {
  install_cpu_tracking_allocator();
  std::string recipe = testing::tiny_text_recipe(tmp_.str());
  const std::string dir = tmp_ / "bert";
  std::map<std::string, at::Tensor> want;
  {
    torch::manual_seed(5);
    auto scratch = build_model(Config::parse("name = \"bert\"\nvocab_size = 30522\nhidden_size = 1024\n"
                                             "num_hidden_layers = 4\nnum_attention_heads = 16\n"
                                             "intermediate_size = 4096\nmax_position_embeddings = 64\n"),
                               DataSpec{{3, 16}, 3});
    ASSERT_TRUE(save_merged_hf_directory(*scratch, dir));
    for (const auto& p : scratch->named_parameters()) want[p.key()] = p.value().detach().clone();
  }
  const auto model_at = recipe.find("[model]"), data_at = recipe.find("[dataset]");
  ASSERT_NE(model_at, std::string::npos);
  ASSERT_NE(data_at, std::string::npos);
  recipe.replace(model_at, data_at - model_at, "[model]\nname = \"bert\"\npath = \"" + dir + "\"\n");
  const auto fit_on = [&](const std::string& device, AtModelCreated& probe) {
    TrainerOptions o = options_for(recipe,
                                   {"runtime.device=" + device, "training.max_steps=1", "eval.every_epochs=0",
                                    "eval.at_end=false", "metrics.console=false", "runtime.num_threads=8",
                                    "plugins.load=[]", "checkpoint.every_epochs=0", "checkpoint.at_end=false"},
                                   "on_" + device.substr(0, 3), {std::shared_ptr<Plugin>(&probe, [](Plugin*) {})});
    o.log_level = "error";
    return Trainer(std::move(o)).fit();
  };
  clear_memory(kCuda, true);
  MemoryMonitor gpu(kCuda), host(kCpu);
  AtModelCreated on_gpu(&gpu, &host);
  const RunResult r = fit_on("cuda:0", on_gpu);
  ASSERT_EQ(r.status, RunStatus::Finished) << r.message;
  EXPECT_EQ(on_gpu.devices, std::set<std::string>{"cuda:0"});
  EXPECT_GT(on_gpu.bytes, 300'000'000);
  EXPECT_LE(double(on_gpu.gpu_peak), 1.05 * double(on_gpu.bytes)) << on_gpu.gpu_peak << " of " << on_gpu.bytes;
  EXPECT_LT(double(on_gpu.host_peak), 0.1 * double(on_gpu.bytes)) << on_gpu.host_peak << " of " << on_gpu.bytes;
  std::size_t compared = 0;
  for (const auto& [name, t] : on_gpu.weights) {
    if (name.rfind("classifier.", 0) == 0) continue;  // a new head: the data has 2 classes
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, want.at(name))) << name;
    ++compared;
  }
  EXPECT_EQ(compared + 2, want.size());
  AtModelCreated on_cpu(nullptr, nullptr);
  const RunResult c = fit_on("cpu", on_cpu);
  ASSERT_EQ(c.status, RunStatus::Finished) << c.message;
  EXPECT_EQ(on_cpu.devices, std::set<std::string>{"cpu"});
  for (const char* name : {"classifier.weight", "classifier.bias"}) {
    ASSERT_TRUE(on_gpu.weights.count(name) && on_cpu.weights.count(name)) << name;
    EXPECT_TRUE(torch::equal(on_gpu.weights.at(name), on_cpu.weights.at(name))) << name;
  }
}

TEST_F(OnGpu, NvmlListsTheGpuTheCudaRuntimeUsesWithThisProcessOnIt) {
  const InventorySnapshot before = system_inventory()->snapshot();
  ASSERT_EQ(before.source, "nvml") << "NVML could not be loaded: " << (before.notes.empty() ? "" : before.notes[0]);
  ASSERT_FALSE(before.gpus.empty());
  const DeviceInfo& g0 = before.gpus[0];
  EXPECT_EQ(g0.id, "cuda:0");
  EXPECT_FALSE(g0.name.empty());
  EXPECT_EQ(g0.uuid.rfind("GPU-", 0), 0u) << g0.uuid;
  EXPECT_GT(g0.total, 0);
  EXPECT_GE(g0.free, 0);
  EXPECT_LE(g0.free, g0.total);
  EXPECT_TRUE(g0.error.empty()) << g0.error;
  // 1 GiB on LibTorch's cuda:0 shows in NVML's cuda:0 (used memory, and this process among its
  // compute processes): the two number the GPUs alike.
  auto block = torch::empty({std::int64_t{1} << 30}, torch::TensorOptions().dtype(torch::kUInt8).device(kCuda));
  torch::cuda::synchronize();
  const InventorySnapshot after = system_inventory()->snapshot();
  ASSERT_FALSE(after.gpus.empty());
  EXPECT_GE(after.gpus[0].used - g0.used, std::int64_t{1} << 30);
  const auto& procs = after.gpus[0].processes;
  const bool listed = std::any_of(procs.begin(), procs.end(), [](const GpuProcess& p) { return p.pid == ::getpid(); });
  if (!listed) {
    // In a container with a PID namespace of its own NVML reports the host's pids: then this
    // process is the one holding at least the 1 GiB whose pid this namespace does not have.
    const bool host_pid = std::any_of(procs.begin(), procs.end(), [](const GpuProcess& p) {
      return p.used_bytes >= (std::int64_t{1} << 30) && ::kill(static_cast<pid_t>(p.pid), 0) != 0 && errno == ESRCH;
    });
    EXPECT_TRUE(host_pid) << procs.size() << " process(es) listed, none pid " << ::getpid()
                          << " nor a pid of another namespace holding 1 GiB";
    RecordProperty("nvml_pid", "another PID namespace: NVML lists the host's pid");
  }
}

/// At FitStart: the run's device, and whether its GPU's lease is held by this process.
class LeaseProbe final : public Plugin {
 public:
  explicit LeaseProbe(std::string dir) : dir_(std::move(dir)) {}
  std::string name() const override { return "lease_probe"; }
  std::vector<Event> events() const override { return {Event::FitStart}; }
  void on_event(EventContext& ctx, Control&) override {
    device = ctx.device.str();
    const InventorySnapshot s = device_inventory()->snapshot();
    if (s.gpus.empty()) return;
    const LeaseState st = DeviceLease::probe(dir_, s.gpus[0].uuid);
    held = st.held &&
           std::any_of(st.holders.begin(), st.holders.end(), [](const LeaseHolder& h) { return h.pid == ::getpid(); });
  }
  std::string device;
  bool held = false;

 private:
  std::string dir_;
};

TEST_F(OnGpu, DeviceSelectPicksTheGpuWithItsLeaseAndFallsBackToTheCpuWhenAnotherProcessTakesIt) {
  const std::string leases = tmp_ / "leases";
  const std::vector<std::string> select = {"plugins.load=[\"device_select\", \"recording\"]",
                                           "+plugins.device_select.device=\"auto\"",
                                           "+plugins.device_select.lease_dir=\"" + leases + "\""};
  auto probe = std::make_shared<LeaseProbe>(leases);
  RunResult r = run("free", select, {probe}, "info");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(probe->device, "cuda:0");
  EXPECT_TRUE(probe->held) << "no lease of cuda:0 held by this process in " << leases;
  EXPECT_NE(read_file(tmp_ / "free/trainer.log").find("device_select: chose cuda:0"), std::string::npos);

  // A second process takes 60 % of the GPU; a run that needs half of it waits 2 s, then runs on
  // the CPU.
  clear_memory(kCuda, true);
  const std::int64_t total = device_inventory()->snapshot().gpus.at(0).total;
  const std::string ready = tmp_ / "hog.ready";
  // `env`: the Child execs its command, and exec takes no VAR=value words.
  testing::Child hog("env TRAINER_HOG_MB=" + std::to_string(total * 6 / 10 >> 20) + " TRAINER_HOG_READY=" + ready +
                     " " + std::filesystem::read_symlink("/proc/self/exe").string() +
                     " --gtest_also_run_disabled_tests --gtest_filter=GpuHog.DISABLED_HoldsMemory >/dev/null 2>&1");
  ASSERT_TRUE(hog.started());
  ASSERT_TRUE(testing::wait_for_text(ready, "ready", std::chrono::seconds(120))) << "the hog did not start";
  auto later = select;
  later.push_back("+plugins.device_select.min_free_mb=" + std::to_string(total / 2 >> 20));
  later.push_back("+plugins.device_select.wait_for_gpu=true");
  later.push_back("+plugins.device_select.check_interval_s=0.5");
  later.push_back("+plugins.device_select.timeout_min=0.033");
  auto probe2 = std::make_shared<LeaseProbe>(leases);
  r = run("busy", later, {probe2}, "info");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(probe2->device, "cpu");
  EXPECT_FALSE(probe2->held);
  const std::string log = read_file(tmp_ / "busy/trainer.log");
  EXPECT_NE(log.find("below min_free_mb"), std::string::npos) << log;
  EXPECT_NE(log.find("falling back to the CPU"), std::string::npos) << log;
}

/// The memory hog of the test above, run as a separate process of this binary: holds
/// $TRAINER_HOG_MB MiB of cuda:0 until killed (at most 5 minutes).
TEST(GpuHog, DISABLED_HoldsMemory) {
  const char* mb = std::getenv("TRAINER_HOG_MB");
  const char* ready = std::getenv("TRAINER_HOG_READY");
  ASSERT_TRUE(mb && ready && have_gpu());
  auto block = torch::empty({std::atoll(mb) << 20}, torch::TensorOptions().dtype(torch::kUInt8).device(kCuda));
  torch::cuda::synchronize();
  write_file(ready, "ready");
  std::this_thread::sleep_for(std::chrono::minutes(5));
}

TEST_F(OnGpu, TwoDataParallelRanksOnTheOneGpuAreAUsageError) {
  write_file(tmp_ / "dp.toml", testing::kSmallRun);
  const auto out = testing::run_command(std::string(TRAINER_CLI) + " launch --nproc 2 -- --recipe " +
                                        (tmp_ / "dp.toml") + " runtime.device=cuda:0 run.dir=" + (tmp_ / "runs"));
  EXPECT_EQ(out.code, kExitUsage) << out.text;
  // "cuda:0", or the GPU's entry in CUDA_VISIBLE_DEVICES where that is set.
  EXPECT_NE(out.text.find("ranks 0 and 1 both use "), std::string::npos) << out.text;
}

// A wide MLP with AdamW (17.9 M parameters: 72 MB of weights, 72 MB of gradients and 143 MB of
// moments on the GPU) whose optimizer state is the largest part of a step.
constexpr const char* kWideMlp = R"(
[run]
seed = 12
[model]
name = "mlp"
hidden = [4096, 4096]
[dataset]
name = "synthetic"
size = 256
eval_size = 64
shape = [1, 16, 16]
[training]
epochs = 1
batch_size = 64
log_every = 1
[optim]
name = "adamw"
lr = 0.001
[eval]
every_epochs = 0
at_end = false
[metrics]
console = false
[plugins]
load = ["oom_backoff"]
)";

/// The highest peak of allocated GPU memory over the training batches, the parameters after
/// the run (CPU copies) and whether the moments were in host memory after each step.
class GpuStepPeak final : public Plugin {
 public:
  std::string name() const override { return "gpu_step_peak"; }
  std::vector<Event> events() const override { return {Event::BatchStart, Event::BatchEnd, Event::FitEnd}; }
  void on_event(EventContext& ctx, Control&) override {
    if (ctx.event == Event::BatchStart) reset_peak_memory(ctx.device);
    if (ctx.event == Event::BatchEnd) {
      peak = std::max(peak, memory_stats(ctx.device).peak_allocated);
      offload.push_back(ctx.state.optimizer_offload);
    }
    if (ctx.event == Event::FitEnd) {
      for (const auto& p : ctx.model->parameters()) params.push_back(p.detach().cpu().clone());
    }
  }
  std::int64_t peak = 0;
  std::vector<bool> offload;
  std::vector<at::Tensor> params;
};

TEST_F(OnGpu, AnOptimizerStepOutOfMemoryOffloadsAdamWsMomentsToHostMemoryAndTrainsOnExactly) {
  auto full = std::make_shared<GpuStepPeak>();
  TrainerOptions plain = options_for(kWideMlp, {"runtime.device=cuda:0"}, "plain", {full});
  ASSERT_EQ(Trainer(std::move(plain)).fit().exit_code, kExitOk);
  const std::int64_t state = 2 * 4 * (256 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 10 + 10);
  // Half the moments less than the step needed: without them on the GPU (a chunk's at a time)
  // the step fits with room to spare; with them it cannot (the allowed moment rungs are none:
  // allow_inexact is off, so the ladder's first rung that applies is offload).
  const std::int64_t budget = full->peak - state / 2;
  auto tight = std::make_shared<GpuStepPeak>();
  TrainerOptions o =
      options_for(kWideMlp, {"runtime.device=cuda:0", fmt::format("+memory.limit_mb={:.6f}", budget / 1048576.0)},
                  "offloaded", {tight});
  o.log_level = "info";
  const RunResult r = Trainer(std::move(o)).fit();
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 4);
  EXPECT_EQ(tight->offload, std::vector<bool>(4, true));
  EXPECT_LT(tight->peak, budget);
  // The moments moved, not converted: AdamW's results, up to the element-wise operations'
  // chunking (the same kernels on pieces of 65,536 values), which on a GPU changes no value.
  ASSERT_EQ(tight->params.size(), full->params.size());
  for (std::size_t i = 0; i < full->params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(tight->params[i], full->params[i], 1e-6, 1e-7))
        << "param " << i << " max diff " << (tight->params[i] - full->params[i]).abs().max().item<double>();
  }
  const std::string log = read_file(tmp_ / "offloaded/trainer.log");
  EXPECT_NE(log.find("oom_backoff: rung offload: out of memory in optimizer_step"), std::string::npos) << log;
  EXPECT_NE(log.find("optimizer moments: offloaded to host memory, streamed through each step, optimizer state on "
                     "cuda:0"),
            std::string::npos)
      << log;
  const RunStatusRecord status = decode_status(read_file(tmp_ / "offloaded/status.json"));
  EXPECT_TRUE(status.optimizer_offload);
}

}  // namespace
}  // namespace trainer
