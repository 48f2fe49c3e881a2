// checkpoint_block: the gradients of a checkpointed model equal the plain model's, dropout
// draws the same masks in the recomputation, autocast is the forward's, and the activation
// memory (measured with the tracking CPU allocator) drops.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/test_util.h"
#include "trainer/activation_checkpoint.h"
#include "trainer/memory.h"
#include "trainer/model.h"
#include "trainer/precision.h"

namespace trainer {
namespace {

using testing::max_abs_diff;

const c10::Device kCpu(c10::kCPU);

/// A 4-layer ViT with 4x4 patches. Its head is drawn at random: torchvision (and so the ViT)
/// starts it at zero, and then no gradient reaches the blocks in a first backward.
std::shared_ptr<Model> tiny_vit(const std::string& extra = "", int layers = 4) {
  torch::manual_seed(3);
  auto m = build_model(
      Config::parse("name = \"vit\"\npatch_size = 4\nnum_layers = " + std::to_string(layers) + "\n" + extra),
      DataSpec{{1, 28, 28}, 10});
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters()) {
    if (p.key().rfind("heads.", 0) == 0) p.value().normal_(0.0, 0.1);
  }
  return m;
}

void checkpoint_every(Model& m, std::size_t every) {
  const auto blocks = m.blocks();
  for (std::size_t i = 0; i < blocks.size(); i += every) {
    blocks[i]->set_wrapper([](Block& b, const at::Tensor& x) { return checkpoint_block(b, x); });
  }
}

/// The parameters' gradients after one forward and backward of `m` on a fixed batch, drawing
/// dropout from `dropout_seed`.
std::vector<at::Tensor> gradients(Model& m, std::uint64_t dropout_seed = 5) {
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({8, 1, 28, 28}), y = torch::randint(0, 10, {8});
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
  torch::manual_seed(dropout_seed);
  torch::nn::functional::cross_entropy(m.forward(x), y).backward();
  std::vector<at::Tensor> g;
  for (const auto& p : m.parameters()) g.push_back(p.grad().clone());
  return g;
}

/// Every block parameter got a gradient that is not all zeros: the comparisons below compare something.
void expect_block_gradients(Model& m) {
  for (const auto& p : m.named_parameters()) {
    if (p.key().find("encoder_layer_") == std::string::npos) continue;
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().max().item<double>(), 0.0) << p.key();
  }
}

TEST(ActivationCheckpoint, GradientsEqualThePlainModelsInFloat32) {
  const auto plain = tiny_vit(), ckpt = tiny_vit();
  checkpoint_every(*ckpt, 1);
  EXPECT_LE(max_abs_diff(gradients(*plain), gradients(*ckpt)), 1e-6);
  expect_block_gradients(*ckpt);
}

TEST(ActivationCheckpoint, WithDropoutTheRecomputationDrawsTheSameMasks) {
  const std::string dropout = "dropout = 0.2\nattention_dropout = 0.2\n";
  const auto plain = tiny_vit(dropout), ckpt = tiny_vit(dropout);
  checkpoint_every(*ckpt, 1);
  const auto g_plain = gradients(*plain);
  const at::Tensor next_plain = torch::rand({4});  // what the run draws next
  const auto g_ckpt = gradients(*ckpt);
  const at::Tensor next_ckpt = torch::rand({4});
  expect_block_gradients(*ckpt);
  EXPECT_LE(max_abs_diff(g_plain, g_ckpt), 1e-6);
  // The recomputation put the generator back: the random stream after a step is the same.
  EXPECT_TRUE(torch::equal(next_plain, next_ckpt));
  // And the masks matter: other masks give other gradients.
  EXPECT_GT(max_abs_diff(g_plain, gradients(*plain, 6)), 1e-4);
}

TEST(ActivationCheckpoint, EveryOtherBlockAlsoGivesTheSameGradients) {
  const auto plain = tiny_vit(), ckpt = tiny_vit();
  checkpoint_every(*ckpt, 2);
  EXPECT_LE(max_abs_diff(gradients(*plain), gradients(*ckpt)), 1e-6);
}

TEST(ActivationCheckpoint, TheRecomputationRunsUnderTheForwardsAutocastState) {
  const auto plain = tiny_vit(), ckpt = tiny_vit();
  checkpoint_every(*ckpt, 1);
  const auto under_bf16 = [](Model& m) {
    torch::manual_seed(1);
    const at::Tensor x = torch::randn({8, 1, 28, 28}), y = torch::randint(0, 10, {8});
    at::Tensor loss;
    {
      AutocastGuard bf16(c10::kCPU, c10::kBFloat16);
      loss = torch::nn::functional::cross_entropy(m.forward(x), y);
    }
    // backward runs outside autocast, as in the training step: the recomputation must not
    loss.backward();
    std::vector<at::Tensor> g;
    for (const auto& p : m.parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const auto g_bf16 = under_bf16(*plain);
  EXPECT_LE(max_abs_diff(g_bf16, under_bf16(*ckpt)), 1e-6);
  expect_block_gradients(*ckpt);
  // Recomputed in float32 instead, the gradients would be the float32 ones, which differ.
  EXPECT_GT(max_abs_diff(g_bf16, gradients(*plain)), 1e-4);
  EXPECT_EQ(autocast_state(), AutocastState{});
}

TEST(ActivationCheckpoint, WithoutGradModeItIsThePlainForward) {
  const auto m = tiny_vit();
  checkpoint_every(*m, 1);
  torch::NoGradGuard no_grad;
  const at::Tensor out = m->forward(torch::randn({2, 1, 28, 28}));
  EXPECT_FALSE(out.requires_grad());
}

TEST(ActivationCheckpoint, ActivationMemoryDrops) {
  install_cpu_tracking_allocator();
  const auto peak_of_step = [](Model& m) {
    torch::manual_seed(1);
    const at::Tensor x = torch::randn({64, 1, 28, 28}), y = torch::randint(0, 10, {64});
    for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
    const std::int64_t before = memory_stats(kCpu).allocated;
    reset_peak_memory(kCpu);
    torch::nn::functional::cross_entropy(m.forward(x), y).backward();
    return memory_stats(kCpu).peak_allocated - before;
  };
  const auto plain = tiny_vit("", 8), ckpt = tiny_vit("", 8);
  checkpoint_every(*ckpt, 1);
  peak_of_step(*plain);  // first calls allocate the gradients: measure the second
  peak_of_step(*ckpt);
  const std::int64_t without = peak_of_step(*plain), with = peak_of_step(*ckpt);
  RecordProperty("peak_without", std::to_string(without));
  RecordProperty("peak_with", std::to_string(with));
  std::cout << "step peak: " << format_bytes(without) << " plain, " << format_bytes(with) << " checkpointed\n";
  EXPECT_LT(with, without / 2) << format_bytes(with) << " vs " << format_bytes(without);
}

}  // namespace
}  // namespace trainer
