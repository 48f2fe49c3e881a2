#pragma once
// Private to model "bert" (bert.cpp): the modules of the BERT and RoBERTa encoders and of the
// masked-LM head, as transformers 4.x names, shapes and computes them.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "model/bert_files.h"
#include "model/deferred_init.h"
#include "model/layer_norm.h"
#include "trainer/layers.h"
#include "trainer/model.h"

namespace trainer::detail::bert {

using detail::BertArch;
using detail::LayerNorm;

inline at::Tensor activation(const std::string& act, const at::Tensor& x) {
  if (act == "gelu") return at::gelu(x);
  if (act == "relu") return at::relu(x);
  if (act == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  // gelu_new: transformers' NewGELUActivation, the tanh approximation written out.
  return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * at::pow(x, 3.0))));
}

/// The most negative value of `dtype`: what transformers adds to the scores of masked keys.
inline double lowest(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return std::numeric_limits<double>::lowest();
    case at::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    case at::kHalf:
      return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    default:
      return static_cast<double>(std::numeric_limits<float>::lowest());
  }
}

/// nn.Embedding: "weight" [n, dim]; the padding row gets no gradient.
class Embedding final : public torch::nn::Module {
 public:
  Embedding(std::int64_t n, std::int64_t dim, std::int64_t padding_idx, double std)
      : padding_idx_(padding_idx), weight_(register_parameter("weight", at::empty({n, dim}, DeferInit::options()))) {
    if (DeferInit::active()) return;  // loaded from a file
    at::NoGradGuard no_grad;
    weight_.normal_(0.0, std);
    if (padding_idx_ >= 0 && padding_idx_ < n) weight_[padding_idx_].zero_();
  }
  at::Tensor forward(const at::Tensor& ids) { return at::embedding(weight_, ids, padding_idx_); }
  const at::Tensor& weight() const { return weight_; }

 private:
  std::int64_t padding_idx_;
  at::Tensor weight_;
};

/// A trainer::Linear initialised as transformers' _init_weights does: normal weight, zero bias.
inline std::shared_ptr<Linear> linear(std::int64_t in, std::int64_t out, double std) {
  auto l = std::make_shared<Linear>(in, out);
  if (DeferInit::active()) return l;  // loaded from a file
  at::NoGradGuard no_grad;
  l->weight().normal_(0.0, std);
  l->bias().zero_();
  return l;
}

class Embeddings final : public torch::nn::Module {
 public:
  explicit Embeddings(const BertArch& a) : a_(a) {
    const bool roberta = a.layout == "roberta";
    word_ = register_module("word_embeddings", std::make_shared<Embedding>(a.vocab, a.hidden, a.pad, a.init_range));
    position_ = register_module("position_embeddings",
                                std::make_shared<Embedding>(a.positions, a.hidden, roberta ? a.pad : -1, a.init_range));
    type_ = register_module("token_type_embeddings", std::make_shared<Embedding>(a.types, a.hidden, -1, a.init_range));
    norm_ = register_module("LayerNorm", std::make_shared<LayerNorm>(a.hidden, a.eps));
  }
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& types) {
    at::Tensor positions;
    if (a_.layout == "roberta") {
      // transformers' create_position_ids_from_input_ids: real tokens count from pad + 1.
      const at::Tensor real = ids.ne(a_.pad).to(at::kInt);
      positions = (at::cumsum(real, 1).to(at::kInt) * real).to(at::kLong) + a_.pad;
    } else {
      positions = at::arange(ids.size(1), ids.options()).unsqueeze(0).expand_as(ids);
    }
    at::Tensor h = word_->forward(ids) + type_->forward(types);
    h = h + position_->forward(positions);
    return at::dropout(norm_->forward(h), a_.hidden_dropout, is_training());
  }
  /// The word embeddings [vocab, hidden], which a masked-LM head's decoder shares.
  const at::Tensor& words() const { return word_->weight(); }

 private:
  BertArch a_;
  std::shared_ptr<Embedding> word_, position_, type_;
  std::shared_ptr<LayerNorm> norm_;
};

/// What the encoder layers read beside their input: the additive attention mask [N, 1, 1, L]
/// of the forward being computed (set before the layers run; an activation checkpoint's
/// recomputation, in the backward, reads the same).
/// NOTE: the recomputation reads the mask of the model's latest forward: a plugin that runs
/// the same model's forward between a training forward and its backward, with activation
/// checkpointing, would give the recomputation that forward's mask. No built-in plugin does.
struct LayerContext {
  at::Tensor mask;
};

class SelfAttention final : public torch::nn::Module {
 public:
  explicit SelfAttention(const BertArch& a) : heads_(a.heads), dropout_(a.attention_dropout) {
    query_ = register_module("query", linear(a.hidden, a.hidden, a.init_range));
    key_ = register_module("key", linear(a.hidden, a.hidden, a.init_range));
    value_ = register_module("value", linear(a.hidden, a.hidden, a.init_range));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask) {
    const std::int64_t n = x.size(0), l = x.size(1), d = x.size(2), head = d / heads_;
    const auto split = [&](const at::Tensor& t) { return t.view({n, l, heads_, head}).permute({0, 2, 1, 3}); };
    const at::Tensor q = split(query_->forward(x)), k = split(key_->forward(x)), v = split(value_->forward(x));
    at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(head));
    scores = scores + mask;
    // The softmax accumulates in float32 when the scores are bfloat16/float16 (autocast).
    const bool reduced = scores.scalar_type() == at::kBFloat16 || scores.scalar_type() == at::kHalf;
    at::Tensor probs = at::softmax(scores, -1, reduced ? at::kFloat : scores.scalar_type()).to(v.scalar_type());
    probs = at::dropout(probs, dropout_, is_training());
    return at::matmul(probs, v).permute({0, 2, 1, 3}).contiguous().view({n, l, d});
  }

 private:
  std::int64_t heads_;
  double dropout_;
  std::shared_ptr<Linear> query_, key_, value_;
};

/// dense -> dropout -> LayerNorm(. + residual): BertSelfOutput and BertOutput.
class DenseNorm final : public torch::nn::Module {
 public:
  DenseNorm(std::int64_t in, const BertArch& a) : dropout_(a.hidden_dropout) {
    dense_ = register_module("dense", linear(in, a.hidden, a.init_range));
    norm_ = register_module("LayerNorm", std::make_shared<LayerNorm>(a.hidden, a.eps));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& residual) {
    return norm_->forward(at::dropout(dense_->forward(x), dropout_, is_training()) + residual);
  }

 private:
  double dropout_;
  std::shared_ptr<Linear> dense_;
  std::shared_ptr<LayerNorm> norm_;
};

class Attention final : public torch::nn::Module {
 public:
  explicit Attention(const BertArch& a) {
    self_ = register_module("self", std::make_shared<SelfAttention>(a));
    output_ = register_module("output", std::make_shared<DenseNorm>(a.hidden, a));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask) {
    return output_->forward(self_->forward(x, mask), x);
  }

 private:
  std::shared_ptr<SelfAttention> self_;
  std::shared_ptr<DenseNorm> output_;
};

/// BertIntermediate: dense -> activation.
class Intermediate final : public torch::nn::Module {
 public:
  explicit Intermediate(const BertArch& a) : act_(a.act) {
    dense_ = register_module("dense", linear(a.hidden, a.intermediate, a.init_range));
  }
  at::Tensor forward(const at::Tensor& x) { return activation(act_, dense_->forward(x)); }

 private:
  std::string act_;
  std::shared_ptr<Linear> dense_;
};

/// BertLayer (post-norm): attention, then the feed-forward, each with its residual and LayerNorm.
class EncoderLayer final : public Block {
 public:
  EncoderLayer(const BertArch& a, std::shared_ptr<LayerContext> context) : context_(std::move(context)) {
    attention_ = register_module("attention", std::make_shared<Attention>(a));
    intermediate_ = register_module("intermediate", std::make_shared<Intermediate>(a));
    output_ = register_module("output", std::make_shared<DenseNorm>(a.intermediate, a));
  }
  at::Tensor forward(const at::Tensor& x) override {
    const at::Tensor h = attention_->forward(x, context_->mask);
    return output_->forward(intermediate_->forward(h), h);
  }

 private:
  std::shared_ptr<LayerContext> context_;
  std::shared_ptr<Attention> attention_;
  std::shared_ptr<Intermediate> intermediate_;
  std::shared_ptr<DenseNorm> output_;
};

/// BertModel / RobertaModel: embeddings, encoder.layer.<i>, and (BERT for sequence
/// classification) the pooler.
class Backbone final : public torch::nn::Module {
 public:
  Backbone(const BertArch& a, bool pooler) : context_(std::make_shared<LayerContext>()) {
    embeddings_ = register_module("embeddings", std::make_shared<Embeddings>(a));
    auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
    auto layers = encoder->register_module("layer", std::make_shared<torch::nn::Module>());
    for (std::int64_t i = 0; i < a.layers; ++i) {
      blocks_.push_back(layers->register_module(std::to_string(i), std::make_shared<EncoderLayer>(a, context_)));
    }
    if (pooler) {
      auto pooler = register_module("pooler", std::make_shared<torch::nn::Module>());
      pooler_ = pooler->register_module("dense", linear(a.hidden, a.hidden, a.init_range));
    }
  }

  /// The last layer's hidden states [N, L, hidden].
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& types) {
    at::Tensor h = embeddings_->forward(ids, types);
    // transformers' extended attention mask: 0 where attended, the dtype's lowest where not.
    const auto dtype = embeddings_->parameters()[0].scalar_type();  // the model's (transformers' self.dtype)
    context_->mask = (1.0 - mask.unsqueeze(1).unsqueeze(2).to(dtype)) * lowest(dtype);
    for (const auto& b : blocks_) h = b->run(h);
    return h;
  }
  /// BertPooler: tanh(dense(first token)).
  at::Tensor pool(const at::Tensor& hidden) { return at::tanh(pooler_->forward(hidden.select(1, 0))); }

  const std::vector<std::shared_ptr<Block>>& blocks() const { return blocks_; }
  const at::Tensor& words() const { return embeddings_->words(); }

 private:
  std::shared_ptr<LayerContext> context_;
  std::shared_ptr<Embeddings> embeddings_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<Linear> pooler_;
};

/// The masked-LM head: BertLMPredictionHead (cls.predictions: transform.dense, the activation,
/// transform.LayerNorm, then the decoder) or RobertaLMHead (lm_head: dense, gelu, layer_norm,
/// the decoder). The decoder's weight is the word embeddings (tied, as transformers ties them:
/// one tensor, which its files leave out), its bias the head's "bias".
class MaskedLmHead final : public torch::nn::Module {
 public:
  explicit MaskedLmHead(const BertArch& a) : act_(a.layout == "bert" ? a.act : "gelu") {
    const bool bert = a.layout == "bert";
    torch::nn::Module& outer = bert ? *register_module("transform", std::make_shared<torch::nn::Module>()) : *this;
    dense_ = outer.register_module("dense", linear(a.hidden, a.hidden, a.init_range));
    norm_ = outer.register_module(bert ? "LayerNorm" : "layer_norm", std::make_shared<LayerNorm>(a.hidden, a.eps));
    bias_ = register_parameter("bias", at::zeros({a.vocab}, DeferInit::options()));
  }
  /// Logits over the vocabulary [N, L, vocab] of the hidden states [N, L, hidden].
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& words) {
    return at::linear(norm_->forward(activation(act_, dense_->forward(hidden))), words, bias_);
  }

 private:
  std::string act_;
  std::shared_ptr<Linear> dense_;
  std::shared_ptr<LayerNorm> norm_;
  at::Tensor bias_;
};

}  // namespace trainer::detail::bert
