// LoRA on the registry's ViT, ResNet and BERT (trainer/lora.h) and the layers it adapts
// (trainer/layers.h): the initialisation of the layers, the adapted model's output at the
// start, merge and unmerge, which parameters get gradients, the adapter and merged-model files,
// the q/k/v parts of the fused attention projection, and Model::keep_in_eval.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "support/hostile_archive.h"
#include "support/test_util.h"
#include "support/zip_patch.h"
#include "trainer/error.h"
#include "trainer/layers.h"
#include "trainer/lora.h"
#include "trainer/model.h"

namespace trainer {
namespace {

using testing::TempDir;

const DataSpec kImages{{1, 28, 28}, 5};

std::shared_ptr<Model> tiny_vit() {
  return build_model(Config::parse("name = \"vit\"\npatch_size = 7\nhidden_dim = 32\nnum_layers = 2\n"
                                   "num_heads = 2\nmlp_dim = 64\n"),
                     kImages);
}

std::shared_ptr<Model> small_resnet() {
  return build_model(Config::parse("name = \"resnet\"\ndepth = 18\nstem = \"small\"\n"), DataSpec{{1, 16, 16}, 5});
}

LoraOptions vit_options() {
  LoraOptions o;
  o.rank = 4;
  o.alpha = 8;
  o.targets = {"*.q_proj", "*.v_proj", "*.out_proj", "*.mlp.0", "*.mlp.3"};
  o.trainable = {"heads.*"};
  return o;
}

/// Gives every adapter's B random values (it starts at zero), so that the adapters matter.
void perturb_adapters(Model& m, double std = 0.05) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.named_parameters()) {
    if (p.key().find(".lora.B") != std::string::npos) p.value().normal_(0.0, std);
  }
}

std::map<std::string, at::Tensor> snapshot(Model& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().detach().clone();
  return out;
}

TEST(Layers, InitialiseAsTorchNn) {
  torch::manual_seed(3);
  torch::nn::Linear ref(5, 7);
  torch::nn::Conv2d ref_conv(torch::nn::Conv2dOptions(3, 4, 3).stride(2).padding(1));
  torch::manual_seed(3);
  Linear lin(5, 7);
  Conv2d conv(3, 4, 3, 2, 1);
  EXPECT_TRUE(torch::equal(lin.weight(), ref->weight));
  EXPECT_TRUE(torch::equal(lin.bias(), ref->bias));
  EXPECT_TRUE(torch::equal(conv.weight(), ref_conv->weight));
  EXPECT_TRUE(torch::equal(conv.bias(), ref_conv->bias));
  const at::Tensor x = torch::randn({2, 3, 9, 9});
  EXPECT_TRUE(torch::allclose(conv.forward(x), ref_conv->forward(x)));
  std::vector<std::string> names;
  for (const auto& p : lin.named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
}

TEST(Layers, APartIsRowsOfTheFusedWeightAndFollowsItsMoves) {
  auto w = torch::randn({6, 4});
  auto b = torch::randn({6});
  auto part = Linear::part_of(w, b, 2, 2);
  EXPECT_TRUE(part->parameters().empty());
  const at::Tensor x = torch::randn({3, 4});
  EXPECT_TRUE(torch::allclose(part->forward(x), at::linear(x, w, b).narrow(1, 2, 2)));
  // Converting the owner in place (as Module::to does, with set_data) is seen by the part.
  w.set_data(w.to(torch::kDouble));
  b.set_data(b.to(torch::kDouble));
  EXPECT_EQ(part->weight().scalar_type(), torch::kDouble);
  EXPECT_THROW(Linear::part_of(w, b, 5, 2), Error);
}

TEST(Lora, OutputEqualsTheBaseModelAtInitialisation) {
  auto vit = tiny_vit();
  vit->eval();
  const at::Tensor x = torch::randn({3, 1, 28, 28});
  const at::Tensor before = vit->forward(x);
  const LoraReport r = apply_lora(*vit, vit_options());
  EXPECT_EQ(r.adapted.size(), 2u * 5u);
  EXPECT_EQ(r.adapted.front(), "encoder.layers.encoder_layer_0.self_attention.out_proj");
  EXPECT_TRUE(torch::equal(vit->forward(x), before));

  auto res = small_resnet();
  res->eval();
  const at::Tensor xr = torch::randn({2, 1, 16, 16});
  const at::Tensor before_r = res->forward(xr);
  LoraOptions o;
  o.targets = {"layer4.*.conv2", "layer3.0.downsample.0"};
  const LoraReport rr = apply_lora(*res, o);
  EXPECT_EQ(rr.adapted.size(), 3u);
  EXPECT_TRUE(torch::equal(res->forward(xr), before_r));
}

TEST(Lora, CountsAndFreezesWhatItShould) {
  auto vit = tiny_vit();
  std::int64_t total = 0;
  for (const auto& p : vit->parameters()) total += p.numel();
  const LoraReport r = apply_lora(*vit, vit_options());
  // Per layer: q, v, out_proj (32 -> 32) 4 * (32 + 32) each; mlp.0 32 -> 64 and mlp.3 64 -> 32,
  // 4 * 96 each. Two layers.
  EXPECT_EQ(r.adapter_parameters, 2 * (3 * 4 * 64 + 2 * 4 * 96));
  EXPECT_EQ(r.trainable_parameters, r.adapter_parameters + 32 * 5 + 5);
  EXPECT_EQ(r.frozen_parameters, total - (32 * 5 + 5));  // every original parameter but the head's
  EXPECT_EQ(r.frozen_parameters + r.trainable_parameters, total + r.adapter_parameters);
  for (const auto& p : vit->named_parameters()) {
    const bool should = p.key().find(".lora.") != std::string::npos || p.key().rfind("heads.", 0) == 0;
    EXPECT_EQ(p.value().requires_grad(), should) << p.key();
  }
}

TEST(Lora, OnlyAdaptersAndHeadReceiveGradients) {
  auto vit = tiny_vit();
  apply_lora(*vit, vit_options());
  perturb_adapters(*vit);
  torch::nn::init::normal_(vit->named_parameters()["heads.head.weight"], 0.0, 0.1);
  const at::Tensor loss = vit->forward(torch::randn({4, 1, 28, 28})).logsumexp(1).mean();
  loss.backward();
  std::int64_t with_grad = 0;
  for (const auto& p : vit->named_parameters()) {
    const bool adapter_or_head = p.key().find(".lora.") != std::string::npos || p.key().rfind("heads.", 0) == 0;
    if (adapter_or_head) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
      ++with_grad;
    } else {
      EXPECT_FALSE(p.value().grad().defined()) << p.key();
    }
  }
  EXPECT_EQ(with_grad, 2 * 5 * 2 + 2);
}

TEST(Lora, MergedForwardEqualsUnmergedAndUnmergeRestores) {
  auto vit = tiny_vit();
  apply_lora(*vit, vit_options());
  perturb_adapters(*vit);
  vit->eval();
  const auto weights = snapshot(*vit);
  const at::Tensor x = torch::randn({3, 1, 28, 28});
  const at::Tensor unmerged = vit->forward(x);
  EXPECT_EQ(merge_adapters(*vit), 10);
  EXPECT_EQ(merge_adapters(*vit), 0);  // merged already
  const at::Tensor merged = vit->forward(x);
  EXPECT_LT((merged - unmerged).abs().max().item<double>(), 1e-5);
  EXPECT_GT((vit->named_parameters()["encoder.layers.encoder_layer_0.mlp.0.weight"] -
             weights.at("encoder.layers.encoder_layer_0.mlp.0.weight"))
                .abs()
                .max()
                .item<double>(),
            1e-4);  // the merge did change the weight
  EXPECT_EQ(unmerge_adapters(*vit), 10);
  for (const auto& [name, t] : snapshot(*vit)) {
    EXPECT_LT((t - weights.at(name)).abs().max().item<double>(), 1e-6) << name;
  }
  EXPECT_LT((vit->forward(x) - unmerged).abs().max().item<double>(), 1e-5);

  // The convolution adapters of the ResNet merge too.
  auto res = small_resnet();
  LoraOptions o;
  o.targets = {"layer1.0.conv1", "layer2.0.conv1", "layer2.0.downsample.0"};
  apply_lora(*res, o);
  perturb_adapters(*res);
  res->eval();
  const at::Tensor xr = torch::randn({2, 1, 16, 16});
  const at::Tensor r_unmerged = res->forward(xr);
  merge_adapters(*res);
  EXPECT_LT((res->forward(xr) - r_unmerged).abs().max().item<double>(), 1e-4);
}

// A BERT's query and value projections (PEFT's target names): the adapted model computes what
// it did until the adapters train; merged, it computes what the adapters add (to float32
// rounding of 64-wide sums, 1e-5), and unmerged it has its weights back (1e-6: W + D - D).
TEST(Lora, BertQueryAndValueAdaptMergeAndUnmerge) {
  torch::manual_seed(5);
  auto m = build_model(Config::parse("name = \"bert\"\nvocab_size = 100\nhidden_size = 32\nnum_hidden_layers = 2\n"
                                     "num_attention_heads = 2\nintermediate_size = 64\nmax_position_embeddings = 16\n"),
                       DataSpec{{3, 12}, 4});
  m->eval();
  const at::Tensor x = at::stack(
      {torch::randint(1, 100, {3, 12}, at::kLong), torch::ones({3, 12}, at::kLong), torch::zeros({3, 12}, at::kLong)},
      1);
  const at::Tensor before = m->forward(x);
  LoraOptions o;
  o.rank = 4;
  o.targets = {"*.query", "*.value"};
  o.trainable = {"classifier.*"};
  const LoraReport r = apply_lora(*m, o);
  ASSERT_EQ(r.adapted.size(), 4u);
  EXPECT_EQ(r.adapted.front(), "bert.encoder.layer.0.attention.self.query");
  EXPECT_EQ(r.adapter_parameters, 4 * 4 * (32 + 32));
  EXPECT_EQ(r.trainable_parameters, r.adapter_parameters + 32 * 4 + 4);
  EXPECT_TRUE(torch::equal(m->forward(x), before));

  perturb_adapters(*m);
  const auto weights = snapshot(*m);
  const at::Tensor unmerged = m->forward(x);
  EXPECT_GT((unmerged - before).abs().max().item<double>(), 1e-4);  // the adapters matter
  EXPECT_EQ(merge_adapters(*m), 4);
  EXPECT_LT((m->forward(x) - unmerged).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(unmerge_adapters(*m), 4);
  for (const auto& [name, t] : snapshot(*m)) {
    EXPECT_LT((t - weights.at(name)).abs().max().item<double>(), 1e-6) << name;
  }
}

TEST(Lora, TheQPartOfTheFusedProjectionChangesOnlyItsRows) {
  auto vit = tiny_vit();
  LoraOptions o;
  o.targets = {"encoder.layers.encoder_layer_1.self_attention.q_proj"};
  apply_lora(*vit, o);
  perturb_adapters(*vit);
  const std::string w = "encoder.layers.encoder_layer_1.self_attention.in_proj_weight";
  const at::Tensor before = vit->named_parameters()[w].detach().clone();
  merge_adapters(*vit);
  const at::Tensor after = vit->named_parameters()[w];
  EXPECT_GT((after.narrow(0, 0, 32) - before.narrow(0, 0, 32)).abs().max().item<double>(), 1e-4);
  EXPECT_TRUE(torch::equal(after.narrow(0, 32, 64), before.narrow(0, 32, 64)));  // k and v untouched
}

TEST(Lora, AdapterFilesRoundTripAndAreSmall) {
  TempDir tmp;
  auto vit = tiny_vit();
  apply_lora(*vit, vit_options());
  perturb_adapters(*vit);
  {
    torch::NoGradGuard no_grad;
    vit->named_parameters()["heads.head.weight"].normal_(0.0, 0.1);
  }
  vit->eval();
  const at::Tensor x = torch::randn({2, 1, 28, 28});
  const at::Tensor expected = vit->forward(x);
  const std::string file = tmp / "adapters.pt";
  EXPECT_EQ(save_adapters(*vit, file), 2 * 5 * 2 + 2);
  torch::save(vit, tmp / "whole.pt");
  EXPECT_LT(std::filesystem::file_size(file) * 2, std::filesystem::file_size(tmp / "whole.pt"));

  torch::manual_seed(99);  // other random adapters and base
  auto other = tiny_vit();
  {
    // The same base weights (adapters are for a given base), other adapters.
    torch::NoGradGuard no_grad;
    auto src = vit->named_parameters();
    for (auto& p : other->named_parameters()) p.value().copy_(src[p.key()]);
  }
  apply_lora(*other, vit_options());
  other->eval();
  EXPECT_FALSE(torch::allclose(other->forward(x), expected));
  EXPECT_EQ(load_adapters(*other, file), 2 * 5 * 2 + 2);
  EXPECT_TRUE(torch::equal(other->forward(x), expected));

  // The same adapters over another base (one frozen weight moved): refused, naming both digests.
  auto moved = tiny_vit();
  {
    torch::NoGradGuard no_grad;
    auto src = vit->named_parameters();
    for (auto& p : moved->named_parameters()) p.value().copy_(src[p.key()]);
    moved->named_parameters()["conv_proj.weight"][0][0][0][0].add_(1e-3);
  }
  apply_lora(*moved, vit_options());
  try {
    load_adapters(*moved, file);
    FAIL() << "adapters were loaded over another base";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("were trained over frozen weights of digest frozen-digest-v1:"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("this model's frozen weights have digest frozen-digest-v1:"),
              std::string::npos)
        << e.what();
  }

  // Other targets, rank or a model without adapters: refused, naming the file.
  auto fewer = tiny_vit();
  LoraOptions o = vit_options();
  o.targets = {"*.q_proj"};
  apply_lora(*fewer, o);
  try {
    load_adapters(*fewer, file);
    FAIL() << "adapters for other targets were loaded";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("is not an adapter, trainable parameter or buffer"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos);
  }
  auto ranked = tiny_vit();
  o = vit_options();
  o.rank = 2;
  apply_lora(*ranked, o);
  EXPECT_THROW(load_adapters(*ranked, file), UsageError);
  EXPECT_THROW(load_adapters(*tiny_vit(), file), UsageError);
  EXPECT_THROW(load_adapters(*other, tmp / "missing.pt"), UsageError);

  // A file from elsewhere whose TorchScript code declares 4 GiB: refused before LibTorch's
  // reader allocates that much to read it out.
  const std::string bomb = tmp / "bomb.pt";
  std::filesystem::copy_file(file, bomb);
  ASSERT_EQ(testing::declare_zip_entry_size(bomb, "/code/__torch__.py", 0xfffffff0u), 2);
  try {
    load_adapters(*other, bomb);
    FAIL() << "an archive declaring 4 GiB was given to LibTorch's reader";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("LoRA adapters \"" + bomb + "\": its archive is refused"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("4294967280 bytes read out"), std::string::npos) << e.what();
  }
}

TEST(Lora, AnAdapterFileThatWouldRunCodeIsRefusedAndNothingRuns) {
  TempDir tmp;
  // A TorchScript archive whose class's __setstate__ creates a file when LibTorch's reader
  // (torch::jit::load) reads it.
  const std::string file = tmp / "adapters.pt", marker = tmp / "ran";
  testing::write_file(file, testing::hostile_archive(marker));
  auto vit = tiny_vit();
  apply_lora(*vit, vit_options());
  try {
    load_adapters(*vit, file);
    FAIL() << "a file of code was loaded as adapters";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("LoRA adapters \"" + file +
                                         "\": not a file of adapters that trainer wrote: code/__torch__.py declares a "
                                         "method"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(Lora, TheAdapterTermIsAlphaOverRankTimesBAOfTheDroppedOutInput) {
  auto vit = tiny_vit();
  LoraOptions o = vit_options();
  o.dropout = 0.5;
  apply_lora(*vit, o);
  perturb_adapters(*vit, 0.5);
  const std::string name = "encoder.layers.encoder_layer_0.mlp.0";
  auto layer = vit->named_modules()[name]->as<Linear>();
  ASSERT_NE(layer, nullptr);
  auto params = vit->named_parameters();
  const at::Tensor W = params[name + ".weight"], b = params[name + ".bias"];
  const at::Tensor A = params[name + ".lora.A"], B = params[name + ".lora.B"];
  ASSERT_EQ(A.sizes(), (at::IntArrayRef{4, 32}));
  ASSERT_EQ(B.sizes(), (at::IntArrayRef{64, 4}));
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({6, 32});
  const at::Tensor base = at::linear(x, W, b);
  const at::Tensor expected = base + (8.0 / 4.0) * x.matmul(A.t()).matmul(B.t());
  vit->eval();  // no dropout
  EXPECT_LT((layer->forward(x) - expected).abs().max().item<double>(), 1e-5);
  vit->train();  // dropout on the adapter's input only: the base term stays whole
  const at::Tensor t1 = layer->forward(x), t2 = layer->forward(x);
  EXPECT_FALSE(torch::allclose(t1, t2));
  EXPECT_FALSE(torch::allclose(t1, expected));
  // Over many samples: not the undropped term, but the same on average (inverted dropout).
  const at::Tensor ones = torch::ones({200, 32});
  const at::Tensor delta = layer->forward(ones) - at::linear(ones, W, b);
  const at::Tensor full = (8.0 / 4.0) * ones.matmul(A.t()).matmul(B.t());
  EXPECT_FALSE(torch::allclose(delta, full, 1e-4, 1e-5));  // dropout is on
  EXPECT_LT((delta.mean() - full.mean()).abs().item<double>(), 0.5 * full.abs().mean().item<double>());  // and rescaled
}

TEST(Lora, ResNetAdapterFilesCarryTheBatchNormStatistics) {
  TempDir tmp;
  torch::manual_seed(3);
  auto res = small_resnet();
  auto fresh = small_resnet();
  {
    torch::NoGradGuard no_grad;  // the same base weights (and buffers) in both
    auto src = res->named_parameters();
    for (auto& p : fresh->named_parameters()) p.value().copy_(src[p.key()]);
  }
  LoraOptions o;
  o.targets = {"layer4.*.conv2"};
  o.trainable = {"fc.*"};
  apply_lora(*res, o);
  perturb_adapters(*res);
  res->train();
  {
    torch::NoGradGuard no_grad;  // training moves the running statistics of every BatchNorm
    for (int i = 0; i < 3; ++i) res->forward(torch::randn({8, 1, 16, 16}) * 2.0 + 1.0);
  }
  res->eval();
  const at::Tensor x = torch::randn({2, 1, 16, 16});
  const at::Tensor expected = res->forward(x);
  const std::string file = tmp / "adapters.pt";
  save_adapters(*res, file);
  apply_lora(*fresh, o);
  fresh->eval();
  EXPECT_FALSE(torch::allclose(fresh->forward(x), expected));
  load_adapters(*fresh, file);
  EXPECT_TRUE(torch::equal(fresh->forward(x), expected));
  EXPECT_TRUE(torch::equal(fresh->named_buffers()["layer1.0.bn1.running_mean"],
                           res->named_buffers()["layer1.0.bn1.running_mean"]));

  // Adapters merged into their weights take no other adapters (the merged product would stay).
  merge_adapters(*fresh);
  try {
    load_adapters(*fresh, file);
    FAIL() << "adapters were loaded into merged layers";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("has its adapter merged into its weight"), std::string::npos) << e.what();
  }
}

TEST(Lora, ALayerAdaptedAlreadyChangesNothing) {
  auto vit = tiny_vit();
  LoraOptions first = vit_options();
  first.targets = {"encoder.layers.encoder_layer_1.*.q_proj"};
  first.trainable = {};
  apply_lora(*vit, first);
  const auto count = [&] {
    std::size_t n = 0;
    for (const auto& p : vit->named_parameters()) n += p.key().find(".lora.") != std::string::npos;
    return n;
  };
  const auto grads = [&] {
    std::size_t n = 0;
    for (const auto& p : vit->named_parameters()) n += p.value().requires_grad();
    return n;
  };
  const std::size_t adapters = count(), training = grads();
  EXPECT_EQ(adapters, 2u);
  // Layer 0's targets come first in the model's order, layer 1's q_proj has one already.
  EXPECT_THROW(apply_lora(*vit, vit_options()), UsageError);
  EXPECT_EQ(count(), adapters);
  EXPECT_EQ(grads(), training);
}

TEST(Lora, TheMergedModelLoadsIntoAPlainModelAsWeights) {
  TempDir tmp;
  auto vit = tiny_vit();
  apply_lora(*vit, vit_options());
  perturb_adapters(*vit);
  vit->eval();
  const auto before = snapshot(*vit);
  const at::Tensor x = torch::randn({2, 1, 28, 28});
  const at::Tensor expected = vit->forward(x);
  const std::string file = tmp / "merged.pt";
  save_merged_model(*vit, file);
  for (const auto& [name, t] : snapshot(*vit)) EXPECT_TRUE(torch::equal(t, before.at(name))) << name;  // untouched
  EXPECT_FALSE(vit->named_modules()["encoder.layers.encoder_layer_0.mlp.0"]->as<Linear>()->merged());

  auto plain = tiny_vit();
  const WeightsReport r = load_weights(*plain, file);
  EXPECT_EQ(r.format, "trainer checkpoint");
  plain->eval();
  EXPECT_LT((plain->forward(x) - expected).abs().max().item<double>(), 1e-5);
}

// The files a LoRA run exports into its run directory (adapters, the merged model, a BERT's
// Hugging Face directory) go through temporaries created new: a link planted at a temporary's
// name is replaced, never written through; a planted hf_model/ link is refused naming it.
TEST(Lora, ExportsGoThroughTemporariesNeverThroughLinksPlantedInTheRunDirectory) {
  TempDir tmp;
  namespace fs = std::filesystem;
  testing::write_file(tmp / "outside.bin", "keep me");
  fs::create_directories(tmp / "run/hf_model");
  fs::create_directories(tmp / "outside-dir");
  for (const char* name :
       {"run/adapters.pt.tmp", "run/hf_model/model.safetensors.tmp", "run/hf_model/config.json.tmp"}) {
    fs::create_symlink(tmp / "outside.bin", tmp / name);
  }
  fs::create_symlink(tmp / "created-through-a-link.pt", tmp / "run/merged.pt.tmp");  // dangling
  auto vit = tiny_vit();
  apply_lora(*vit, vit_options());
  save_adapters(*vit, tmp / "run/adapters.pt");
  save_merged_model(*vit, tmp / "run/merged.pt");
  auto bert =
      build_model(Config::parse("name = \"bert\"\nvocab_size = 100\nhidden_size = 32\nnum_hidden_layers = 1\n"
                                "num_attention_heads = 2\nintermediate_size = 64\nmax_position_embeddings = 16\n"),
                  DataSpec{{3, 12}, 4});
  LoraOptions o;
  o.rank = 2;
  o.targets = {"*.query", "*.value"};
  apply_lora(*bert, o);
  ASSERT_TRUE(save_merged_hf_directory(*bert, tmp / "run/hf_model"));
  EXPECT_EQ(testing::read_file(tmp / "outside.bin"), "keep me");
  EXPECT_FALSE(fs::exists(tmp / "created-through-a-link.pt"));
  for (const char* name :
       {"run/adapters.pt", "run/merged.pt", "run/hf_model/model.safetensors", "run/hf_model/config.json"}) {
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(tmp / name))) << name;
    EXPECT_FALSE(fs::exists(fs::symlink_status(tmp / name + std::string(".tmp")))) << name;
  }
  // The directory itself a link: refused, naming it, nothing written where it leads.
  fs::create_symlink(tmp / "outside-dir", tmp / "run/hf_linked");
  try {
    save_merged_hf_directory(*bert, tmp / "run/hf_linked");
    ADD_FAILURE() << "wrote through a linked directory";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(tmp / "run/hf_linked" + " is a symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(tmp / "outside-dir"));
}

TEST(Lora, BadOptionsNameWhatIsWrong) {
  auto vit = tiny_vit();
  LoraOptions o = vit_options();
  o.targets = {"*.query"};
  try {
    apply_lora(*vit, o);
    FAIL();
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'*.query' matches no Linear or Conv2d layer"), std::string::npos) << what;
    EXPECT_NE(what.find("encoder.layers.encoder_layer_0.self_attention.out_proj"), std::string::npos) << what;
  }
  o = vit_options();
  o.trainable = {"head.*"};
  EXPECT_THROW(apply_lora(*tiny_vit(), o), UsageError);
  o = vit_options();
  o.rank = 0;
  EXPECT_THROW(apply_lora(*tiny_vit(), o), UsageError);
  o = vit_options();
  o.targets.clear();
  EXPECT_THROW(apply_lora(*tiny_vit(), o), UsageError);
  apply_lora(*vit, vit_options());
  EXPECT_THROW(apply_lora(*vit, vit_options()), UsageError);  // adapted already
  // The MLP has no adaptable layer.
  auto mlp = build_model(Config::parse("name = \"mlp\"\n"), kImages);
  EXPECT_THROW(apply_lora(*mlp, vit_options()), UsageError);
}

TEST(ModelModes, KeepInEvalSurvivesTrain) {
  auto res = small_resnet();
  auto layer1 = res->named_modules()["layer1"];
  res->keep_in_eval(layer1);
  res->train();
  EXPECT_TRUE(res->is_training());
  EXPECT_FALSE(layer1->is_training());
  EXPECT_FALSE(res->named_modules()["layer1.0.bn1"]->is_training());
  EXPECT_TRUE(res->named_modules()["layer2.0.bn1"]->is_training());
  res->eval();
  EXPECT_FALSE(res->named_modules()["layer2.0.bn1"]->is_training());
}

TEST(ModelModes, FeaturesFeedTheHead) {
  auto vit = tiny_vit();
  vit->eval();
  torch::nn::init::normal_(vit->named_parameters()["heads.head.weight"], 0.0, 0.1);
  const at::Tensor x = torch::randn({2, 1, 28, 28});
  const at::Tensor f = vit->features(x);
  EXPECT_EQ(f.sizes().vec(), (std::vector<std::int64_t>{2, 32}));
  auto head = vit->named_modules()[vit->head_name()]->as<Linear>();
  ASSERT_NE(head, nullptr);
  EXPECT_TRUE(torch::allclose(head->forward(f), vit->forward(x)));
  auto res = small_resnet();
  EXPECT_EQ(res->head_name(), "fc");
  EXPECT_EQ(res->features(torch::randn({2, 1, 16, 16})).size(1), 512);
  auto mlp = build_model(Config::parse("name = \"mlp\"\n"), kImages);
  EXPECT_EQ(mlp->head_name(), "");
  EXPECT_THROW(mlp->features(x), UsageError);
}

}  // namespace
}  // namespace trainer
