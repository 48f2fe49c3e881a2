// GradScaler on the CPU with float32 gradients and injected inf/NaN: the arithmetic of PyTorch's
// torch.amp.GradScaler (scale, unscale with the non-finite check, backoff, growth).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "trainer/grad_scaler.h"

namespace trainer {
namespace {

/// Two parameters with gradients `scale` times {1, 2, 3} and {4, 5}.
struct Params {
  explicit Params(double scale) {
    a = torch::zeros({3}, torch::requires_grad());
    b = torch::zeros({2}, torch::requires_grad());
    a.mutable_grad() = torch::tensor({1.0, 2.0, 3.0}) * scale;
    b.mutable_grad() = torch::tensor({4.0, 5.0}) * scale;
  }
  std::vector<at::Tensor> list() const { return {a, b}; }
  at::Tensor a, b;
};

GradScalerOptions opts(std::int64_t growth_interval) {
  GradScalerOptions o;
  o.growth_interval = growth_interval;
  return o;
}

TEST(GradScaler, ScalesTheLossAndUnscalesTheGradientsBack) {
  GradScaler s;
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.scale(torch::tensor(0.5)).item<double>(), 32768.0);
  Params p(65536.0);
  EXPECT_FALSE(s.unscale(p.list()));
  EXPECT_TRUE(torch::equal(p.a.grad(), torch::tensor({1.0f, 2.0f, 3.0f})));
  EXPECT_TRUE(torch::equal(p.b.grad(), torch::tensor({4.0f, 5.0f})));
}

TEST(GradScaler, AnInfOrNaNGradientIsFoundAndHalvesTheScale) {
  for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    GradScaler s(opts(3));
    Params p(65536.0);
    p.b.mutable_grad()[1] = bad;
    EXPECT_TRUE(s.unscale(p.list())) << bad;
    s.update();
    EXPECT_EQ(s.get_scale(), 32768.0);
    EXPECT_EQ(s.growth_tracker(), 0);
  }
}

TEST(GradScaler, TheScaleGrowsAfterGrowthIntervalCleanStepsAndAnOverflowRestartsTheCount) {
  GradScaler s(opts(3));
  for (int step = 0; step < 2; ++step) {
    EXPECT_FALSE(s.unscale(Params(s.get_scale()).list()));
    s.update();
  }
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 2);
  Params overflow(s.get_scale());
  overflow.a.mutable_grad()[0] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(s.unscale(overflow.list()));
  s.update();
  EXPECT_EQ(s.get_scale(), 32768.0);
  EXPECT_EQ(s.growth_tracker(), 0);  // the clean steps before the overflow no longer count
  for (int step = 0; step < 3; ++step) {
    EXPECT_FALSE(s.unscale(Params(s.get_scale()).list()));
    s.update();
  }
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScaler, GrowthThatWouldOverflowFloat32KeepsTheScale) {
  GradScalerOptions o = opts(1);
  o.init_scale = 3e38;  // times 2 is past float32's maximum
  GradScaler s(o);
  const double start = s.get_scale();
  EXPECT_FALSE(s.unscale(Params(1.0).list()));
  s.update();
  EXPECT_EQ(s.get_scale(), start);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScaler, UnscalingTwiceInOneStepIsRefusedUnlessTheAttemptIsDiscarded) {
  GradScaler s;
  Params p(65536.0);
  EXPECT_FALSE(s.unscale(p.list()));
  EXPECT_THROW(s.unscale(p.list()), std::exception);
  EXPECT_TRUE(torch::equal(p.a.grad(), torch::tensor({1.0f, 2.0f, 3.0f}))) << "divided twice";
  // An out-of-memory retry recomputes the gradients: only the retry's unscale counts.
  s.discard_unscale();
  Params retried(65536.0);
  EXPECT_FALSE(s.unscale(retried.list()));
  s.update();
  EXPECT_EQ(s.growth_tracker(), 1);
}

TEST(GradScaler, UpdateWithoutUnscaleCountsNothing) {
  GradScaler s(opts(1));
  s.update();  // a batch skipped before its gradients existed
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScaler, ParametersWithoutGradientsAreLeftAlone) {
  GradScaler s;
  Params p(65536.0);
  at::Tensor frozen = torch::zeros({4}, torch::requires_grad());
  EXPECT_FALSE(s.unscale({p.a, frozen, p.b}));
  EXPECT_FALSE(frozen.grad().defined());
}

TEST(GradScaler, StateLoadsBackAndBadStateIsRefused) {
  GradScaler s(opts(5));
  s.load(1024.0, 3);
  EXPECT_EQ(s.get_scale(), 1024.0);
  EXPECT_EQ(s.growth_tracker(), 3);
  EXPECT_THROW(s.load(std::numeric_limits<double>::infinity(), 0), std::exception);
  EXPECT_THROW(s.load(0.0, 0), std::exception);
  EXPECT_THROW(s.load(8.0, -1), std::exception);
  EXPECT_THROW(s.load(1e39, 0), std::exception);  // past float32's range
  // A count saved under a longer growth_interval grows at the next clean step.
  s.load(8.0, 10);
  EXPECT_FALSE(s.unscale(Params(8.0).list()));
  s.update();
  EXPECT_EQ(s.get_scale(), 16.0);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScaler, BackingOffNeverReachesZero) {
  GradScalerOptions o;
  o.init_scale = 1e-45;  // float32's smallest denormal
  GradScaler s(o);
  Params p(1.0);
  p.a.mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(s.unscale(p.list()));
  s.update();
  EXPECT_GT(s.get_scale(), 0.0);
}

TEST(GradScaler, OptionsOutsidePyTorchsRangesAreRefused) {
  GradScalerOptions o;
  o.growth_factor = 1.0;
  EXPECT_THROW(GradScaler{o}, std::exception);
  o = {};
  o.backoff_factor = 1.0;
  EXPECT_THROW(GradScaler{o}, std::exception);
  o = {};
  o.growth_interval = 0;
  EXPECT_THROW(GradScaler{o}, std::exception);
  o = {};
  o.init_scale = -1;
  EXPECT_THROW(GradScaler{o}, std::exception);
  o.init_scale = 1e39;  // inf as a float32
  EXPECT_THROW(GradScaler{o}, std::exception);
}

}  // namespace
}  // namespace trainer
