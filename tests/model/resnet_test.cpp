// The ResNet of the model registry: torchvision's depths and names, its blocks, the small stem,
// bad settings, and activation checkpointing of blocks with BatchNorm.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/test_util.h"
#include "trainer/activation_checkpoint.h"
#include "trainer/error.h"
#include "trainer/model.h"

namespace trainer {
namespace {

using testing::max_abs_diff;

std::shared_ptr<Model> resnet(const std::string& extra, const DataSpec& data = DataSpec{{3, 64, 64}, 10}) {
  return build_model(Config::parse("name = \"resnet\"\n" + extra), data);
}

std::int64_t count(Model& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

TEST(Resnet, DepthsHaveTorchvisionsParameterCountsAndBlocks) {
  // torchvision 0.14: sum(p.numel() for p in resnetD(num_classes=10).parameters()).
  const auto r18 = resnet("depth = 18\n");
  EXPECT_EQ(count(*r18), 11181642);
  EXPECT_EQ(r18->blocks().size(), 8u);
  const auto r50 = resnet("depth = 50\n");
  EXPECT_EQ(count(*r50), 23528522);
  EXPECT_EQ(r50->blocks().size(), 16u);
  EXPECT_EQ(resnet("depth = 34\n")->blocks().size(), 16u);
}

TEST(Resnet, NamesAreTorchvisions) {
  const auto m = resnet("depth = 18\n");
  std::vector<std::string> names;
  for (const auto& p : m->named_parameters()) names.push_back(p.key());
  std::vector<std::string> buffers;
  for (const auto& b : m->named_buffers()) buffers.push_back(b.key());
  ASSERT_EQ(names.size(), 62u);
  EXPECT_EQ(names.front(), "conv1.weight");
  EXPECT_EQ(names[1], "bn1.weight");
  EXPECT_EQ(names[3], "layer1.0.conv1.weight");
  EXPECT_NE(std::find(names.begin(), names.end(), "layer2.0.downsample.0.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "layer2.0.downsample.1.bias"), names.end());
  EXPECT_EQ(names.back(), "fc.bias");
  EXPECT_NE(std::find(buffers.begin(), buffers.end(), "layer4.1.bn2.num_batches_tracked"), buffers.end());
}

TEST(Resnet, SmallStemKeepsTheResolutionForTinyImages) {
  const auto m = resnet("depth = 18\nstem = \"small\"\n", DataSpec{{1, 28, 28}, 10});
  m->eval();
  const at::Tensor out = m->forward(torch::randn({2, 1, 28, 28}));
  EXPECT_EQ(out.sizes().vec(), (std::vector<std::int64_t>{2, 10}));
  EXPECT_EQ(m->named_parameters()["conv1.weight"].sizes().vec(), (std::vector<std::int64_t>{64, 1, 3, 3}));
}

TEST(Resnet, ZeroInitResidualStartsEachBlockAsTheIdentityBranch) {
  const auto m = resnet("depth = 50\nzero_init_residual = true\n");
  EXPECT_EQ(m->named_parameters()["layer1.0.bn3.weight"].abs().sum().item<double>(), 0.0);
  EXPECT_GT(m->named_parameters()["layer1.0.bn2.weight"].abs().sum().item<double>(), 0.0);
}

TEST(Resnet, BadSettingsAreUsageErrors) {
  EXPECT_THROW(resnet("depth = 20\n"), UsageError);
  EXPECT_THROW(resnet("depth = 18\n", DataSpec{{784}, 10}), UsageError);
}

TEST(Resnet, CheckpointedBlocksGiveTheSameGradientsAndMoveBatchNormOnce) {
  auto build = [] {
    torch::manual_seed(4);
    return resnet("depth = 18\nstem = \"small\"\n", DataSpec{{1, 16, 16}, 10});
  };
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({4, 1, 16, 16}), y = torch::randint(0, 10, {4});
  auto step = [&](Model& m) {
    m.train();
    torch::nn::functional::cross_entropy(m.forward(x), y).backward();
    std::vector<at::Tensor> grads, buffers;
    for (const auto& p : m.parameters()) grads.push_back(p.grad().clone());
    for (const auto& b : m.buffers()) buffers.push_back(b.clone());
    return std::make_pair(grads, buffers);
  };
  const auto plain = build();
  const auto [g_plain, b_plain] = step(*plain);
  const auto ckpt = build();
  for (const auto& b : ckpt->blocks()) {
    b->set_wrapper([](Block& blk, const at::Tensor& in) { return checkpoint_block(blk, in); });
  }
  const auto [g_ckpt, b_ckpt] = step(*ckpt);
  EXPECT_LE(max_abs_diff(g_plain, g_ckpt), 1e-6);
  // Running mean/var moved once (not twice) and num_batches_tracked is 1 everywhere.
  EXPECT_EQ(max_abs_diff(b_plain, b_ckpt), 0.0);
  EXPECT_EQ(ckpt->named_buffers()["layer1.0.bn1.num_batches_tracked"].item<std::int64_t>(), 1);
  EXPECT_GT(ckpt->named_buffers()["layer1.0.bn1.running_mean"].abs().sum().item<double>(), 0.0);
}

}  // namespace
}  // namespace trainer
