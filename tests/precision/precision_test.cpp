// Autocast state, its guard, hardware detection, and what bf16 autocast does on the CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "trainer/precision.h"

namespace trainer {
namespace {

class Precision : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(0); }
  void TearDown() override { EXPECT_EQ(autocast_state(), AutocastState{}) << "a test left autocast switched on"; }
};

TEST_F(Precision, AGuardSwitchesAutocastOnAndRestoresTheStateBefore) {
  const AutocastState before = autocast_state();
  EXPECT_FALSE(before.cpu_enabled);
  {
    AutocastGuard on(c10::kCPU, c10::kBFloat16);
    EXPECT_TRUE(autocast_state().cpu_enabled);
    EXPECT_EQ(autocast_state().cpu_dtype, c10::kBFloat16);
    EXPECT_FALSE(autocast_state().cuda_enabled);
    {
      AutocastGuard off(c10::kCPU, c10::kBFloat16, /*enabled=*/false);  // nested: autocast off inside
      EXPECT_FALSE(autocast_state().cpu_enabled);
    }
    EXPECT_TRUE(autocast_state().cpu_enabled);
  }
  EXPECT_EQ(autocast_state(), before);
}

TEST_F(Precision, AGuardRestoresTheStateWhenAnExceptionUnwindsIt) {
  try {
    AutocastGuard on(c10::kCPU, c10::kBFloat16);
    AutocastGuard cuda(c10::kCUDA, c10::kHalf);
    throw std::runtime_error("forward failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(autocast_state(), AutocastState{});
}

TEST_F(Precision, AGuardFromACapturedStateRecreatesIt) {
  AutocastState captured;
  {
    AutocastGuard on(c10::kCPU, c10::kBFloat16);
    captured = autocast_state();
  }
  ASSERT_FALSE(autocast_state().cpu_enabled);
  {
    AutocastGuard again(captured);
    EXPECT_EQ(autocast_state(), captured);
  }
  EXPECT_FALSE(autocast_state().cpu_enabled);
}

TEST_F(Precision, AGuardRefusesADeviceTypeWithoutAutocast) {
  EXPECT_THROW(AutocastGuard(c10::kMeta, c10::kBFloat16), std::exception);
}

TEST_F(Precision, UnderBf16AutocastLinearAndConvComputeInBf16AndTheLossTracksFloat32) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, 8, 3).padding(1));
  torch::nn::Linear fc(8 * 28 * 28, 10);
  const at::Tensor x = torch::randn({16, 1, 28, 28});
  const at::Tensor y = torch::randint(0, 10, {16});
  const auto loss_of = [&](at::Tensor* conv_out, at::Tensor* logits) {
    *conv_out = conv->forward(x);
    *logits = fc->forward(torch::relu(*conv_out).flatten(1));
    return torch::nn::functional::cross_entropy(*logits, y);
  };
  at::Tensor c32, l32, c16, l16;
  const double fp32 = loss_of(&c32, &l32).item<double>();
  at::Tensor loss16;
  {
    AutocastGuard on(c10::kCPU, c10::kBFloat16);
    loss16 = loss_of(&c16, &l16);
  }
  EXPECT_EQ(c16.scalar_type(), c10::kBFloat16);
  EXPECT_EQ(l16.scalar_type(), c10::kBFloat16);
  EXPECT_EQ(loss16.scalar_type(), c10::kFloat);  // cross entropy runs in float32 under autocast
  EXPECT_EQ(c32.scalar_type(), c10::kFloat);
  // bfloat16 keeps 8 bits of mantissa: relative error about 2^-8 per operation.
  EXPECT_NEAR(loss16.item<double>(), fp32, 0.02 * std::abs(fp32));
}

TEST_F(Precision, CpuinfoFlagsAreReadFromTheFirstProcessor) {
  const std::string amx =
      "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
      "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu\n";
  const CpuFeatures f = parse_cpuinfo(amx);
  EXPECT_EQ(f.model, "Intel(R) Xeon(R) Platinum 8481C");
  EXPECT_TRUE(f.avx2 && f.avx512f && f.avx512_bf16 && f.amx_bf16 && f.amx_tile);
  const CpuFeatures epyc = parse_cpuinfo("model name\t: AMD EPYC 7B13\nflags\t\t: fpu avx avx2 fma\n");
  EXPECT_EQ(epyc.model, "AMD EPYC 7B13");
  EXPECT_TRUE(epyc.avx2);
  EXPECT_FALSE(epyc.avx512f || epyc.avx512_bf16 || epyc.amx_bf16);
  EXPECT_FALSE(parse_cpuinfo("").avx2);
}

TEST_F(Precision, NativeBf16OnTheCpuFollowsItsFlagsAndSaysWhy) {
  const CpuFeatures& f = cpu_features();
  std::string why;
  EXPECT_EQ(native_bf16(c10::Device(c10::kCPU), &why), f.amx_bf16 || f.avx512_bf16);
  EXPECT_NE(why.find("BF16"), std::string::npos) << why;
  if (!f.model.empty()) {
    EXPECT_NE(why.find(f.model), std::string::npos) << why;
  }
}

TEST_F(Precision, NativeBf16OnAGpuFollowsItsComputeCapability) {
  std::string why;
  const bool native = native_bf16(c10::Device(c10::kCUDA, 0), &why);
  const int cc = cuda_compute_capability(0);
  EXPECT_EQ(native, cc >= 80) << why;
  if (cc == 0) {
    EXPECT_NE(why.find("unknown"), std::string::npos) << why;
  } else {
    EXPECT_NE(why.find("compute capability"), std::string::npos) << why;
  }
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(cc, 0);  // a CPU build, or no GPU visible
  }
}

}  // namespace
}  // namespace trainer
