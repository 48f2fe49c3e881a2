// The Vision Transformer (Dosovitskiy et al., 2021) as torchvision builds it: parameter names,
// shapes and initialisation follow torchvision.models.VisionTransformer, so that its weights map
// onto this model name for name.
#include "model/vit.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/conv.h>
#include <torch/serialize/input-archive.h>

#include <cmath>
#include <string>

#include "model/layer_norm.h"
#include "trainer/error.h"
#include "trainer/layers.h"

namespace trainer {

namespace {

using detail::LayerNorm;

/// torch.nn.init.trunc_normal_(t, 0, std, a, b): a normal of mean 0 and `std` truncated to
/// [a, b] (absolute bounds), drawn by inverting the normal CDF on a uniform sample, as PyTorch.
void trunc_normal_(at::Tensor t, double std, double a, double b) {
  const auto cdf = [](double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; };
  const double lo = cdf(a / std), hi = cdf(b / std);
  at::NoGradGuard no_grad;
  // Drawn in float32 whatever t's dtype (erfinv has no bfloat16 kernel on every build).
  at::Tensor x = at::empty(t.sizes(), t.options().dtype(at::kFloat));
  x.uniform_(2 * lo - 1, 2 * hi - 1).erfinv_().mul_(std * std::sqrt(2.0)).clamp_(a, b);
  t.copy_(x);
}

/// torch.nn.MultiheadAttention's parameters (in_proj_weight [3D, D] holding q, k, v;
/// in_proj_bias; out_proj) and its computation, self-attention only, batch first. The q, k
/// and v rows of the fused projection are also the parts q_proj, k_proj, v_proj (no
/// parameters of their own), so that an adapter can target each.
class SelfAttention final : public torch::nn::Module {
 public:
  SelfAttention(std::int64_t dim, std::int64_t heads, double dropout) : heads_(heads), dropout_(dropout) {
    in_proj_weight_ = register_parameter("in_proj_weight", at::empty({3 * dim, dim}));
    in_proj_bias_ = register_parameter("in_proj_bias", at::zeros({3 * dim}));
    out_proj_ = register_module("out_proj", std::make_shared<Linear>(dim, dim));
    const char* names[] = {"q_proj", "k_proj", "v_proj"};
    for (std::int64_t i = 0; i < 3; ++i) {
      parts_[i] = register_module(names[i], Linear::part_of(in_proj_weight_, in_proj_bias_, i * dim, dim));
    }
    torch::nn::init::xavier_uniform_(in_proj_weight_);
    torch::nn::init::zeros_(out_proj_->bias());
  }

  /// x: [N, S, D] -> [N, S, D].
  at::Tensor forward(const at::Tensor& x) {
    const std::int64_t n = x.size(0), s = x.size(1), d = x.size(2), head_dim = d / heads_;
    const auto qkv = at::linear(x, in_proj_weight_, in_proj_bias_).chunk(3, -1);
    const auto split = [&](const at::Tensor& t) { return t.reshape({n, s, heads_, head_dim}).transpose(1, 2); };
    const at::Tensor q = split(parts_[0]->adapt(qkv[0], x)) / std::sqrt(static_cast<double>(head_dim));
    const at::Tensor k = split(parts_[1]->adapt(qkv[1], x)), v = split(parts_[2]->adapt(qkv[2], x));
    const at::Tensor scores = at::matmul(q, k.transpose(-2, -1));  // [N, H, S, S]
    // The softmax accumulates in float32 when the scores are bfloat16/float16 (autocast).
    const bool reduced = scores.scalar_type() == at::kBFloat16 || scores.scalar_type() == at::kHalf;
    at::Tensor attn = at::softmax(scores, -1, reduced ? at::kFloat : scores.scalar_type()).to(v.scalar_type());
    attn = at::dropout(attn, dropout_, is_training());
    const at::Tensor out = at::matmul(attn, v).transpose(1, 2).reshape({n, s, d});
    return out_proj_->forward(out);
  }

  /// Module::load, except that a part without an adapter may be absent: it holds nothing, and
  /// checkpoints written before the parts existed lack it.
  void load(torch::serialize::InputArchive& archive) override {
    for (auto& p : named_parameters(/*recurse=*/false)) archive.read(p.key(), p.value());
    for (auto& b : named_buffers(/*recurse=*/false)) archive.read(b.key(), b.value(), /*is_buffer=*/true);
    for (const auto& child : named_children()) {
      torch::serialize::InputArchive sub;
      const bool empty = child.value()->parameters().empty() && child.value()->buffers().empty();
      if (empty && !archive.try_read(child.key(), sub)) continue;
      if (!empty) archive.read(child.key(), sub);
      child.value()->load(sub);
    }
  }

 private:
  std::int64_t heads_;
  double dropout_;
  at::Tensor in_proj_weight_, in_proj_bias_;
  std::shared_ptr<Linear> out_proj_;
  std::shared_ptr<Linear> parts_[3];
};

/// torchvision's MLPBlock: Linear -> GELU -> Dropout -> Linear -> Dropout, the Linears at the
/// Sequential positions 0 and 3 (their parameter names).
class Mlp final : public torch::nn::Module {
 public:
  Mlp(std::int64_t dim, std::int64_t hidden, double dropout) : dropout_(dropout) {
    fc1_ = register_module("0", std::make_shared<Linear>(dim, hidden));
    fc2_ = register_module("3", std::make_shared<Linear>(hidden, dim));
    for (const auto& l : {fc1_, fc2_}) {
      torch::nn::init::xavier_uniform_(l->weight());
      torch::nn::init::normal_(l->bias(), 0.0, 1e-6);
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::dropout(at::gelu(fc1_->forward(x)), dropout_, is_training());
    return at::dropout(fc2_->forward(h), dropout_, is_training());
  }

 private:
  double dropout_;
  std::shared_ptr<Linear> fc1_, fc2_;
};

/// One pre-norm encoder layer: x + attention(ln_1(x)), then + mlp(ln_2(.)).
class EncoderBlock final : public Block {
 public:
  explicit EncoderBlock(const VitSettings& o) : dropout_(o.dropout) {
    ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(o.hidden_dim, 1e-6));
    attention_ = register_module("self_attention",
                                 std::make_shared<SelfAttention>(o.hidden_dim, o.num_heads, o.attention_dropout));
    ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(o.hidden_dim, 1e-6));
    mlp_ = register_module("mlp", std::make_shared<Mlp>(o.hidden_dim, o.mlp_dim, o.dropout));
  }
  at::Tensor forward(const at::Tensor& x) override {
    const at::Tensor y = at::dropout(attention_->forward(ln_1_->forward(x)), dropout_, is_training()) + x;
    return y + mlp_->forward(ln_2_->forward(y));
  }

 private:
  double dropout_;
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<SelfAttention> attention_;
  std::shared_ptr<Mlp> mlp_;
};

/// torchvision's Encoder: position embedding, dropout, the layers, a final LayerNorm.
class Encoder final : public torch::nn::Module {
 public:
  Encoder(const VitSettings& o, std::int64_t seq_len) : dropout_(o.dropout) {
    pos_embedding_ = register_parameter("pos_embedding", at::empty({1, seq_len, o.hidden_dim}));
    torch::nn::init::normal_(pos_embedding_, 0.0, 0.02);
    auto layers = register_module("layers", std::make_shared<torch::nn::Module>());
    for (std::int64_t i = 0; i < o.num_layers; ++i) {
      blocks_.push_back(
          layers->register_module("encoder_layer_" + std::to_string(i), std::make_shared<EncoderBlock>(o)));
    }
    ln_ = register_module("ln", std::make_shared<LayerNorm>(o.hidden_dim, 1e-6));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::dropout(x + pos_embedding_, dropout_, is_training());
    for (const auto& b : blocks_) h = b->run(h);
    return ln_->forward(h);
  }
  const std::vector<std::shared_ptr<Block>>& blocks() const { return blocks_; }

 private:
  double dropout_;
  at::Tensor pos_embedding_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<LayerNorm> ln_;
};

class Vit final : public Model {
 public:
  Vit(const VitSettings& o, const DataSpec& data) {
    TRAINER_CHECK_T(UsageError, data.sample_shape.size() == 3, "model 'vit' needs image samples [C, H, W], got ",
                    data.sample_shape.size(), " dimensions");
    const std::int64_t c = data.sample_shape[0], h = data.sample_shape[1], w = data.sample_shape[2];
    TRAINER_CHECK_T(UsageError, h % o.patch_size == 0 && w % o.patch_size == 0, "model.patch_size = ", o.patch_size,
                    " does not divide the ", h, "x", w, " images; use a divisor of both (",
                    h == 28 && w == 28 ? "4, 7, 14 for Fashion-MNIST" : "e.g. 16 for 224x224", ")");
    TRAINER_CHECK_T(UsageError, o.hidden_dim % o.num_heads == 0, "model.hidden_dim = ", o.hidden_dim,
                    " is not a multiple of model.num_heads = ", o.num_heads);
    const std::int64_t patches = (h / o.patch_size) * (w / o.patch_size);
    conv_proj_ = register_module(
        "conv_proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, o.hidden_dim, o.patch_size).stride(o.patch_size)));
    // As torchvision: a normal of std sqrt(1 / fan_in) truncated to [-2, 2].
    trunc_normal_(conv_proj_->weight, std::sqrt(1.0 / static_cast<double>(c * o.patch_size * o.patch_size)), -2.0, 2.0);
    torch::nn::init::zeros_(conv_proj_->bias);
    class_token_ = register_parameter("class_token", at::zeros({1, 1, o.hidden_dim}));
    encoder_ = register_module("encoder", std::make_shared<Encoder>(o, patches + 1));
    auto heads = register_module("heads", std::make_shared<torch::nn::Module>());
    head_ = heads->register_module("head", std::make_shared<Linear>(o.hidden_dim, data.num_classes));
    torch::nn::init::zeros_(head_->weight());
    torch::nn::init::zeros_(head_->bias());
  }

  at::Tensor forward(const at::Tensor& input) override { return head_->forward(features(input)); }

  std::string head_name() const override { return "heads.head"; }
  /// The class token's output after the final LayerNorm: [N, hidden_dim].
  at::Tensor features(const at::Tensor& input) override {
    const std::int64_t n = input.size(0);
    // [N, C, H, W] -> [N, D, H/p, W/p] -> [N, patches, D]
    const at::Tensor x = conv_proj_->forward(input).flatten(2).transpose(1, 2);
    const at::Tensor tokens = at::cat({class_token_.expand({n, -1, -1}), x}, 1);
    return encoder_->forward(tokens).select(1, 0);
  }

  std::vector<std::shared_ptr<Block>> blocks() override { return encoder_->blocks(); }

 private:
  torch::nn::Conv2d conv_proj_{nullptr};
  at::Tensor class_token_;
  std::shared_ptr<Encoder> encoder_;
  std::shared_ptr<Linear> head_;
};

}  // namespace

std::shared_ptr<Model> make_vit(const VitSettings& settings, const DataSpec& data) {
  return std::make_shared<Vit>(settings, data);
}

}  // namespace trainer
