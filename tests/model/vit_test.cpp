// The ViT of the model registry: torchvision's parameter names and shapes, its sizes, its blocks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "trainer/error.h"
#include "trainer/model.h"

namespace trainer {
namespace {

std::shared_ptr<Model> vit(const std::string& extra, const DataSpec& data) {
  return build_model(Config::parse("name = \"vit\"\n" + extra), data);
}

TEST(Vit, ParameterNamesAndShapesAreTorchvisions) {
  // torchvision 0.14: VisionTransformer(image_size=28, patch_size=7, num_layers=2, num_heads=4,
  // hidden_dim=64, mlp_dim=128, num_classes=10).state_dict() (vit_reference.py prints it), with
  // conv_proj's input channels 1 instead of torchvision's fixed 3.
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected = {
      {"class_token", {1, 1, 64}},
      {"conv_proj.weight", {64, 1, 7, 7}},
      {"conv_proj.bias", {64}},
      {"encoder.pos_embedding", {1, 17, 64}},
      {"encoder.layers.encoder_layer_0.ln_1.weight", {64}},
      {"encoder.layers.encoder_layer_0.ln_1.bias", {64}},
      {"encoder.layers.encoder_layer_0.self_attention.in_proj_weight", {192, 64}},
      {"encoder.layers.encoder_layer_0.self_attention.in_proj_bias", {192}},
      {"encoder.layers.encoder_layer_0.self_attention.out_proj.weight", {64, 64}},
      {"encoder.layers.encoder_layer_0.self_attention.out_proj.bias", {64}},
      {"encoder.layers.encoder_layer_0.ln_2.weight", {64}},
      {"encoder.layers.encoder_layer_0.ln_2.bias", {64}},
      {"encoder.layers.encoder_layer_0.mlp.0.weight", {128, 64}},
      {"encoder.layers.encoder_layer_0.mlp.0.bias", {128}},
      {"encoder.layers.encoder_layer_0.mlp.3.weight", {64, 128}},
      {"encoder.layers.encoder_layer_0.mlp.3.bias", {64}},
      {"encoder.layers.encoder_layer_1.ln_1.weight", {64}},
      {"encoder.layers.encoder_layer_1.ln_1.bias", {64}},
      {"encoder.layers.encoder_layer_1.self_attention.in_proj_weight", {192, 64}},
      {"encoder.layers.encoder_layer_1.self_attention.in_proj_bias", {192}},
      {"encoder.layers.encoder_layer_1.self_attention.out_proj.weight", {64, 64}},
      {"encoder.layers.encoder_layer_1.self_attention.out_proj.bias", {64}},
      {"encoder.layers.encoder_layer_1.ln_2.weight", {64}},
      {"encoder.layers.encoder_layer_1.ln_2.bias", {64}},
      {"encoder.layers.encoder_layer_1.mlp.0.weight", {128, 64}},
      {"encoder.layers.encoder_layer_1.mlp.0.bias", {128}},
      {"encoder.layers.encoder_layer_1.mlp.3.weight", {64, 128}},
      {"encoder.layers.encoder_layer_1.mlp.3.bias", {64}},
      {"encoder.ln.weight", {64}},
      {"encoder.ln.bias", {64}},
      {"heads.head.weight", {10, 64}},
      {"heads.head.bias", {10}},
  };
  const auto m =
      vit("patch_size = 7\nnum_layers = 2\nnum_heads = 4\nhidden_dim = 64\nmlp_dim = 128\n", DataSpec{{1, 28, 28}, 10});
  const auto params = m->named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  std::size_t i = 0;
  for (const auto& p : params) {
    EXPECT_EQ(p.key(), expected[i].first);
    EXPECT_EQ(p.value().sizes().vec(), expected[i].second) << p.key();
    ++i;
  }
}

TEST(Vit, B16At224HasTorchvisionsParameterCount) {
  // sum(p.numel() for p in torchvision.models.vit_b_16().parameters()) == 86567656
  const auto m = vit("patch_size = 16\nnum_layers = 12\nnum_heads = 12\nhidden_dim = 768\nmlp_dim = 3072\n",
                     DataSpec{{3, 224, 224}, 1000});
  std::int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  EXPECT_EQ(n, 86567656);
  EXPECT_EQ(m->blocks().size(), 12u);
}

TEST(Vit, ForwardGivesLogitsPerSampleAndExposesOneBlockPerLayer) {
  const auto m = vit("patch_size = 4\nnum_layers = 3\n", DataSpec{{1, 28, 28}, 10});
  EXPECT_EQ(m->forward(torch::randn({5, 1, 28, 28})).sizes().vec(), (std::vector<std::int64_t>{5, 10}));
  EXPECT_EQ(m->blocks().size(), 3u);
}

TEST(Vit, AWrapperOnABlockIsWhatTheModelCalls) {
  const auto m = vit("num_layers = 2\n", DataSpec{{1, 28, 28}, 10});
  int calls = 0;
  m->blocks()[1]->set_wrapper([&](Block& b, const at::Tensor& x) {
    ++calls;
    return b.forward(x);
  });
  const at::Tensor x = torch::randn({2, 1, 28, 28});
  const at::Tensor wrapped = m->forward(x);
  EXPECT_EQ(calls, 1);
  m->blocks()[1]->set_wrapper(nullptr);
  EXPECT_TRUE(torch::equal(m->forward(x), wrapped));
  EXPECT_EQ(calls, 1);
}

TEST(Vit, APatchThatDoesNotDivideTheImageOrHeadsThatDoNotDivideTheWidthAreUsageErrors) {
  try {
    vit("patch_size = 5\n", DataSpec{{1, 28, 28}, 10});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("model.patch_size = 5 does not divide the 28x28 images"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(vit("hidden_dim = 30\nnum_heads = 4\n", DataSpec{{1, 28, 28}, 10}), UsageError);
  EXPECT_THROW(vit("", DataSpec{{784}, 10}), UsageError);
}

TEST(Vit, BuiltInBfloat16HasEveryParameterInBfloat16AndRunsForward) {
  const auto m = vit("dtype = \"bfloat16\"\n", DataSpec{{1, 28, 28}, 10});
  for (const auto& p : m->parameters()) EXPECT_EQ(p.scalar_type(), c10::kBFloat16);
  EXPECT_EQ(m->forward(torch::randn({2, 1, 28, 28}, torch::kBFloat16)).scalar_type(), c10::kBFloat16);
}

}  // namespace
}  // namespace trainer
