// The memory API: tracking allocator, budget, stats, monitor, OOM detection.
#include "trainer/memory.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "trainer/model.h"
#include "trainer/optim.h"

namespace trainer {
namespace {

const c10::Device kCpu(c10::kCPU);

class Memory : public ::testing::Test {
 protected:
  void SetUp() override {
    install_cpu_tracking_allocator();
    set_memory_limit(kCpu, 0);
  }
  void TearDown() override { set_memory_limit(kCpu, 0); }
};

TEST_F(Memory, CountsEveryTensorByteAndPeak) {
  const auto before = memory_stats(kCpu);
  MemoryMonitor mon(kCpu);
  {
    auto t = torch::empty({1000}, torch::kFloat);
    EXPECT_EQ(memory_stats(kCpu).allocated - before.allocated, 4000);
  }
  EXPECT_EQ(mon.delta(), 0);
  EXPECT_EQ(mon.peak_delta(), 4000);
  EXPECT_GE(memory_stats(kCpu).reserved, memory_stats(kCpu).allocated);
}

TEST_F(Memory, BudgetRaisesARealOutOfMemoryError) {
  const auto base = memory_stats(kCpu);
  set_memory_limit(kCpu, base.allocated + (1 << 20));
  auto fits = torch::empty({(1 << 20) / 8}, torch::kFloat);  // 512 KiB
  try {
    auto too_big = torch::empty({1 << 20}, torch::kFloat);  // 4 MiB
    FAIL() << "expected an OOM";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("CPU out of memory: tried to allocate 4.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("budget (memory.limit_mb)"), std::string::npos) << msg;
    EXPECT_TRUE(is_out_of_memory(e));
  }
  const auto after = memory_stats(kCpu);
  EXPECT_EQ(after.num_ooms, base.num_ooms + 1);
  EXPECT_EQ(after.last_failed_request, 4 << 20);
  EXPECT_EQ(after.allocated, base.allocated + (1 << 19));  // the refused bytes are not counted
}

TEST_F(Memory, OomInsideBackwardIsCaughtByType) {
  auto w = torch::randn({256, 256}, torch::requires_grad());
  auto loss = torch::mm(torch::randn({512, 256}), w).relu().sum();
  set_memory_limit(kCpu, memory_stats(kCpu).allocated + 1024);
  EXPECT_THROW(loss.backward(), c10::OutOfMemoryError);
}

TEST_F(Memory, MessageFallbackOnlyForPlainOutOfMemoryErrors) {
  EXPECT_TRUE(is_out_of_memory(c10::Error({"f", "file", 1}, "CUDA error: out of memory")));
  EXPECT_FALSE(is_out_of_memory(c10::Error({"f", "file", 1}, "shape mismatch")));
  EXPECT_FALSE(is_out_of_memory(std::runtime_error("out of memory")));  // not from LibTorch
}

TEST_F(Memory, FormatsBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 * 1024), "3.00 KiB");
  EXPECT_EQ(format_bytes(12 * 1024 * 1024 + 512 * 1024), "12.5 MiB");
}

TEST_F(Memory, ModelsLoadOnceAndMoveOnce) {
  const DataSpec spec{{1, 28, 28}, 10};
  MemoryMonitor build(kCpu);
  auto model = model_registry().get("mlp").factory(Config::parse("hidden = [512, 256]\ndropout = 0.0"), spec);
  model->to(kCpu);
  std::int64_t param_bytes = 0;
  for (const auto& p : model->parameters()) param_bytes += p.nbytes();
  EXPECT_LE(double(build.peak_delta()), 1.05 * double(param_bytes));
  MemoryMonitor second(kCpu);
  model->to(kCpu);
  EXPECT_EQ(second.peak_delta(), 0);  // a second move allocates nothing
}

TEST_F(Memory, ModelsAreBuiltInTheirTargetDtype) {
  const DataSpec spec{{1, 28, 28}, 10};
  for (const auto& [name, dtype] : {std::pair{"float64", c10::kDouble}, std::pair{"bfloat16", c10::kBFloat16}}) {
    SCOPED_TRACE(name);
    MemoryMonitor build(kCpu);
    auto model =
        build_model(Config::parse(std::string("name = \"cnn\"\nchannels = [8, 16]\nhidden = 64\ndropout = 0.0\n"
                                              "batch_norm = true\ndtype = \"") +
                                  name + "\""),
                    spec);
    model->to(kCpu);
    std::int64_t bytes = 0;
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.scalar_type(), dtype);
      bytes += p.nbytes();
    }
    for (const auto& b : model->named_buffers()) {
      if (b.key().find("num_batches_tracked") == std::string::npos) {
        EXPECT_EQ(b.value().scalar_type(), dtype);
      }
      bytes += b.value().nbytes();
    }
    // Built in place: no float32 copy existed on the way (that would be 2x or 3x the bytes).
    EXPECT_LE(double(build.peak_delta()), 1.05 * double(bytes));
    EXPECT_EQ(c10::get_default_dtype(), caffe2::TypeMeta::Make<float>());  // restored
  }
}

TEST_F(Memory, MovingOptimizerStateCopiesNothingTwiceAndLeavesNothingBehind) {
  // The meta device (no storage) stands in for a second device on this CPU-only LibTorch:
  // what the move takes off the CPU shows in the CPU counters, and a move that copied
  // everything first and freed afterwards would show as a CPU peak. (Parameters cannot go to
  // meta: Module::to's set_data refuses a CPU -> meta swap, which it allows for CPU <-> CUDA.)
  const DataSpec spec{{1, 28, 28}, 10};
  auto model = build_model(Config::parse("name = \"mlp\"\nhidden = [256]\ndropout = 0.0"), spec);
  std::vector<at::Tensor> params = model->parameters();
  auto opt = optimizer_registry().get("adamw").factory(
      Config::parse("lr = 0.1\nweight_decay = 0.0\nbetas = [0.9, 0.999]\neps = 1e-8\namsgrad = false"), params);
  ASSERT_TRUE(materialize_optimizer_state(*opt));
  std::int64_t param_bytes = 0;
  for (const auto& p : params) param_bytes += p.nbytes();
  const c10::Device meta(c10::kMeta);
  MemoryMonitor move(kCpu);
  EXPECT_EQ(move_optimizer_state(*opt, meta), 2 * param_bytes);  // exp_avg and exp_avg_sq
  EXPECT_EQ(move.peak_delta(), 0);                               // nothing allocated on the source
  EXPECT_EQ(move.delta(), -2 * param_bytes);                     // both moments left it
  EXPECT_EQ(move_optimizer_state(*opt, meta), 0);                // a second move moves nothing
  EXPECT_EQ(opt->state().size(), model->parameters().size());    // every parameter keeps its state
  for (const auto& [key, st] : opt->state()) {
    EXPECT_TRUE(static_cast<torch::optim::AdamWParamState&>(*st).exp_avg().is_meta());
  }
}

TEST_F(Memory, MaterialisedOptimizerStateGivesTheSameFirstStep) {
  for (const char* opt : {"adamw", "sgd"}) {
    SCOPED_TRACE(opt);
    const Config cfg = std::string(opt) == "adamw"
                           ? Config::parse("lr = 0.1\nbetas = [0.9, 0.999]\neps = 1e-8\nweight_decay = 0.01")
                           : Config::parse("lr = 0.1\nmomentum = 0.9\nnesterov = true\nweight_decay = 0.01");
    torch::manual_seed(3);
    auto a = torch::randn({4, 3}, torch::requires_grad());
    auto b = a.detach().clone().requires_grad_(true);
    auto lazy = optimizer_registry().get(opt).factory(cfg, {a});
    auto eager = optimizer_registry().get(opt).factory(cfg, {b});
    ASSERT_TRUE(materialize_optimizer_state(*eager));
    for (int step = 0; step < 3; ++step) {
      a.mutable_grad() = torch::full({4, 3}, 0.5 + step);
      b.mutable_grad() = torch::full({4, 3}, 0.5 + step);
      lazy->step();
      eager->step();
      EXPECT_TRUE(torch::equal(a, b)) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace trainer
