// BERT (Devlin et al., 2019) and RoBERTa (Liu et al., 2019) as Hugging Face's transformers
// 4.x builds them for sequence classification: the parameter names, the shapes, the order of the
// operations (so that its weights load name for name and the logits agree to float rounding)
// and the initialisation of a model trained from scratch.
#include "model/bert.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include <spdlog/logger.h>
#include "model/layer_norm.h"
#include "model/safetensors.h"
#include "model/weights_file.h"
#include "trainer/error.h"
#include "trainer/json.h"
#include "trainer/layers.h"
#include "trainer/logging.h"
#include "util/durable_file.h"

namespace trainer {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using detail::LayerNorm;

/// The architecture, from config.json or the recipe's keys.
struct Arch {
  std::string layout;  ///< "bert" or "roberta"
  std::int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, intermediate = 0, positions = 0, types = 0, pad = 0;
  std::string act;
  double hidden_dropout = 0, attention_dropout = 0, classifier_dropout = 0, eps = 0, init_range = 0;
};

Arch arch_of(const BertSettings& s) {
  return {s.layout,
          s.vocab_size,
          s.hidden_size,
          s.num_hidden_layers,
          s.num_attention_heads,
          s.intermediate_size,
          s.max_position_embeddings,
          s.type_vocab_size,
          s.pad_token_id,
          s.hidden_act,
          s.hidden_dropout_prob,
          s.attention_probs_dropout_prob,
          s.hidden_dropout_prob,
          s.layer_norm_eps,
          s.initializer_range};
}

/// The architecture keys set away from their defaults: with model.path they would be ignored.
std::vector<std::string> architecture_keys_set(const BertSettings& s) {
  const BertSettings d;
  const Arch a = arch_of(s), b = arch_of(d);
  std::vector<std::string> set;
  const auto check = [&](bool differs, const char* key) {
    if (differs) set.emplace_back(key);
  };
  check(a.layout != b.layout, "layout");
  check(a.vocab != b.vocab, "vocab_size");
  check(a.hidden != b.hidden, "hidden_size");
  check(a.layers != b.layers, "num_hidden_layers");
  check(a.heads != b.heads, "num_attention_heads");
  check(a.intermediate != b.intermediate, "intermediate_size");
  check(a.positions != b.positions, "max_position_embeddings");
  check(a.types != b.types, "type_vocab_size");
  check(a.pad != b.pad, "pad_token_id");
  check(a.act != b.act, "hidden_act");
  check(a.hidden_dropout != b.hidden_dropout, "hidden_dropout_prob");
  check(a.attention_dropout != b.attention_dropout, "attention_probs_dropout_prob");
  check(a.eps != b.eps, "layer_norm_eps");
  check(a.init_range != b.init_range, "initializer_range");
  return set;
}

/// config.json is at most this big (bert-base's is 570 bytes; one with a label map of 10,000
/// classes about 300 KB).
constexpr std::int64_t kMaxConfigBytes = 4 << 20;

class ConfigJson {
 public:
  explicit ConfigJson(std::string file) : file_(std::move(file)) {
    std::error_code ec;
    const auto size = fs::file_size(file_, ec);
    TRAINER_CHECK_T(UsageError, !ec, "model.path: no ", file_,
                    "; a Hugging Face model directory holds config.json beside its weights (save_pretrained writes "
                    "both)");
    TRAINER_CHECK_T(UsageError, static_cast<std::int64_t>(size) <= kMaxConfigBytes, file_, " is ", size,
                    " bytes; a model's config.json is a few KB (at most ", kMaxConfigBytes, " read)");
    std::ifstream in(file_, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    TRAINER_CHECK_T(UsageError, json_nesting(text) <= 16, file_, ": JSON nested deeper than a config.json is");
    json_ = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    TRAINER_CHECK_T(UsageError, !json_.is_discarded() && json_.is_object(), file_, ": not a JSON object");
  }

  bool has(const char* key) const { return json_.contains(key) && !json_[key].is_null(); }

  std::int64_t integer(const char* key, std::optional<std::int64_t> fallback, std::int64_t min = 1) const {
    if (!has(key)) {
      TRAINER_CHECK_T(UsageError, fallback.has_value(), file_, ": no ", key, "; transformers' config.json has it");
      return *fallback;
    }
    const Json& v = json_[key];
    TRAINER_CHECK_T(UsageError, v.is_number_integer() && v.get<std::int64_t>() >= min, file_, ": ", key, " is ",
                    v.dump().substr(0, 80), "; it must be an integer of at least ", min);
    return v.get<std::int64_t>();
  }

  double number(const char* key, double fallback, double lo, double hi) const {
    if (!has(key)) return fallback;
    const Json& v = json_[key];
    TRAINER_CHECK_T(UsageError, v.is_number() && v.get<double>() >= lo && v.get<double>() < hi, file_, ": ", key,
                    " is ", v.dump().substr(0, 80), "; it must be a number in [", lo, ", ", hi, ")");
    return v.get<double>();
  }

  std::string text(const char* key, std::optional<std::string> fallback) const {
    if (!has(key)) {
      TRAINER_CHECK_T(UsageError, fallback.has_value(), file_, ": no ", key, "; transformers' config.json has it");
      return *fallback;
    }
    const Json& v = json_[key];
    TRAINER_CHECK_T(UsageError, v.is_string(), file_, ": ", key, " is ", v.dump().substr(0, 80), ", not a string");
    return v.get<std::string>();
  }

  const std::string& file() const { return file_; }
  const Json& json() const { return json_; }

 private:
  std::string file_;
  Json json_;
};

/// The architecture a model directory's config.json describes (transformers' BertConfig and
/// RobertaConfig, their defaults where a key is absent).
Arch arch_of(const ConfigJson& c) {
  Arch a;
  const std::string type = c.text("model_type", std::nullopt);
  if (type == "bert") {
    a.layout = "bert";
  } else if (type == "roberta" || type == "xlm-roberta" || type == "camembert") {
    a.layout = "roberta";
  } else {
    throw UsageError(fmt::format(
        "{}: model_type \"{}\" is not an architecture trainer builds; it reads bert, roberta, xlm-roberta and "
        "camembert (BERT's and RoBERTa's layout)",
        c.file(), type.substr(0, 64)));
  }
  const bool roberta = a.layout == "roberta";
  a.vocab = c.integer("vocab_size", std::nullopt);
  a.hidden = c.integer("hidden_size", std::nullopt);
  a.layers = c.integer("num_hidden_layers", std::nullopt);
  a.heads = c.integer("num_attention_heads", std::nullopt);
  a.intermediate = c.integer("intermediate_size", std::nullopt);
  a.positions = c.integer("max_position_embeddings", std::nullopt);
  a.types = c.integer("type_vocab_size", 2);
  a.pad = c.integer("pad_token_id", roberta ? 1 : 0, 0);
  a.act = c.text("hidden_act", "gelu");
  TRAINER_CHECK_T(UsageError, a.act == "gelu" || a.act == "gelu_new" || a.act == "gelu_pytorch_tanh" || a.act == "relu",
                  c.file(), ": hidden_act \"", a.act.substr(0, 64),
                  "\" is not one trainer computes: gelu, gelu_new, gelu_pytorch_tanh, relu");
  const std::string positions = c.text("position_embedding_type", "absolute");
  TRAINER_CHECK_T(UsageError, positions == "absolute", c.file(), ": position_embedding_type \"",
                  positions.substr(0, 64), "\"; trainer computes absolute (learned) positions only");
  a.hidden_dropout = c.number("hidden_dropout_prob", 0.1, 0, 1);
  a.attention_dropout = c.number("attention_probs_dropout_prob", 0.1, 0, 1);
  a.classifier_dropout = c.number("classifier_dropout", a.hidden_dropout, 0, 1);
  a.eps = c.number("layer_norm_eps", 1e-12, 0, 1);
  TRAINER_CHECK_T(UsageError, a.eps > 0, c.file(), ": layer_norm_eps must be positive");
  a.init_range = c.number("initializer_range", 0.02, 0, 10);
  return a;
}

at::Tensor activation(const std::string& act, const at::Tensor& x) {
  if (act == "gelu") return at::gelu(x);
  if (act == "relu") return at::relu(x);
  if (act == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  // gelu_new: transformers' NewGELUActivation, the tanh approximation written out.
  return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * at::pow(x, 3.0))));
}

/// The most negative value of `dtype`: what transformers adds to the scores of masked keys.
double lowest(c10::ScalarType dtype) {
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
      : padding_idx_(padding_idx), weight_(register_parameter("weight", at::empty({n, dim}))) {
    at::NoGradGuard no_grad;
    weight_.normal_(0.0, std);
    if (padding_idx_ >= 0 && padding_idx_ < n) weight_[padding_idx_].zero_();
  }
  at::Tensor forward(const at::Tensor& ids) { return at::embedding(weight_, ids, padding_idx_); }

 private:
  std::int64_t padding_idx_;
  at::Tensor weight_;
};

/// A trainer::Linear initialised as transformers' _init_weights does: normal weight, zero bias.
std::shared_ptr<Linear> linear(std::int64_t in, std::int64_t out, double std) {
  auto l = std::make_shared<Linear>(in, out);
  at::NoGradGuard no_grad;
  l->weight().normal_(0.0, std);
  l->bias().zero_();
  return l;
}

class Embeddings final : public torch::nn::Module {
 public:
  explicit Embeddings(const Arch& a) : a_(a) {
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

 private:
  Arch a_;
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
  explicit SelfAttention(const Arch& a) : heads_(a.heads), dropout_(a.attention_dropout) {
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
  DenseNorm(std::int64_t in, const Arch& a) : dropout_(a.hidden_dropout) {
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
  explicit Attention(const Arch& a) {
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
  explicit Intermediate(const Arch& a) : act_(a.act) {
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
  EncoderLayer(const Arch& a, std::shared_ptr<LayerContext> context) : context_(std::move(context)) {
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

/// BertModel / RobertaModel: embeddings, encoder.layer.<i>, and (BERT) the pooler.
class Backbone final : public torch::nn::Module {
 public:
  explicit Backbone(const Arch& a) : context_(std::make_shared<LayerContext>()) {
    embeddings_ = register_module("embeddings", std::make_shared<Embeddings>(a));
    auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
    auto layers = encoder->register_module("layer", std::make_shared<torch::nn::Module>());
    for (std::int64_t i = 0; i < a.layers; ++i) {
      blocks_.push_back(layers->register_module(std::to_string(i), std::make_shared<EncoderLayer>(a, context_)));
    }
    if (a.layout == "bert") {
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

 private:
  std::shared_ptr<LayerContext> context_;
  std::shared_ptr<Embeddings> embeddings_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<Linear> pooler_;
};

class Bert final : public Model {
 public:
  /// `config`: the config.json the architecture came from (null when from the recipe's keys).
  Bert(const Arch& a, std::int64_t labels, Json config) : a_(a), labels_(labels), config_(std::move(config)) {
    backbone_ = register_module(a.layout, std::make_shared<Backbone>(a));
    if (a.layout == "bert") {
      head_ = register_module("classifier", linear(a.hidden, labels, a.init_range));
    } else {
      // RobertaClassificationHead: dense -> tanh -> out_proj on the first token.
      auto classifier = register_module("classifier", std::make_shared<torch::nn::Module>());
      dense_ = classifier->register_module("dense", linear(a.hidden, a.hidden, a.init_range));
      head_ = classifier->register_module("out_proj", linear(a.hidden, labels, a.init_range));
    }
    for (const auto& p : named_parameters()) base_names_.insert(p.key());
  }

  /// config.json for transformers: the one the model came from, with this model's sizes, labels
  /// and dtype.
  Json hf_config() const {
    Json c = config_.is_object() ? config_ : Json::object();
    const bool bert = a_.layout == "bert";
    c["architectures"] = {bert ? "BertForSequenceClassification" : "RobertaForSequenceClassification"};
    if (!c.contains("model_type")) c["model_type"] = a_.layout;
    c["vocab_size"] = a_.vocab;
    c["hidden_size"] = a_.hidden;
    c["num_hidden_layers"] = a_.layers;
    c["num_attention_heads"] = a_.heads;
    c["intermediate_size"] = a_.intermediate;
    c["max_position_embeddings"] = a_.positions;
    c["type_vocab_size"] = a_.types;
    c["pad_token_id"] = a_.pad;
    c["hidden_act"] = a_.act;
    c["hidden_dropout_prob"] = a_.hidden_dropout;
    c["attention_probs_dropout_prob"] = a_.attention_dropout;
    c["classifier_dropout"] = a_.classifier_dropout;
    c["layer_norm_eps"] = a_.eps;
    c["initializer_range"] = a_.init_range;
    c["position_embedding_type"] = "absolute";
    Json id2label = Json::object(), label2id = Json::object();
    for (std::int64_t i = 0; i < labels_; ++i) {
      id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
      label2id["LABEL_" + std::to_string(i)] = i;
    }
    c["id2label"] = id2label;
    c["label2id"] = label2id;
    const auto dtype = parameters()[0].scalar_type();
    c["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kDouble ? "float64" : "float32";
    return c;
  }

  /// Whether the parameters are the architecture's own (no adapter added since it was built).
  bool plain() const {
    std::set<std::string> names;
    for (const auto& p : named_parameters()) names.insert(p.key());
    return names == base_names_;
  }

  at::Tensor forward(const at::Tensor& input) override { return head_->forward(features(input)); }

  std::string head_name() const override { return a_.layout == "bert" ? "classifier" : "classifier.out_proj"; }

  /// The head's input: BERT's pooled first token, RoBERTa's classifier.dense output (after
  /// their dropouts).
  at::Tensor features(const at::Tensor& input) override {
    const Tokens t = tokens(input);
    const at::Tensor h = backbone_->forward(t.ids, t.mask, t.types);
    const double p = a_.classifier_dropout;
    if (a_.layout == "bert") return at::dropout(backbone_->pool(h), p, is_training());
    const at::Tensor first = at::dropout(h.select(1, 0), p, is_training());
    return at::dropout(at::tanh(dense_->forward(first)), p, is_training());
  }

  std::vector<std::shared_ptr<Block>> blocks() override { return backbone_->blocks(); }

 private:
  struct Tokens {
    at::Tensor ids, mask, types;
  };

  /// The batch's ids, attention mask and token types, each [N, L'], cut to the longest
  /// sequence of this batch (L' = its last attended position): a micro-batch of short
  /// sequences computes over its own length, whatever the batch was padded to.
  Tokens tokens(const at::Tensor& input) const {
    TRAINER_CHECK_T(UsageError,
                    !input.is_floating_point() &&
                        (input.dim() == 2 || (input.dim() == 3 && (input.size(1) == 2 || input.size(1) == 3))),
                    "model 'bert' takes token ids: [N, L], [N, 2, L] (ids, attention mask) or [N, 3, L] (ids, mask, "
                    "token types), integers; it was given ",
                    c10::toString(input.scalar_type()), " ", input.sizes(), " (a text dataset gives them)");
    Tokens t;
    const at::Tensor in = input.to(at::kLong);
    t.ids = input.dim() == 2 ? in : in.select(1, 0);
    t.mask = input.dim() == 2 ? t.ids.ne(a_.pad).to(at::kLong) : in.select(1, 1);
    t.types = input.dim() == 3 && input.size(1) == 3 ? in.select(1, 2) : at::zeros_like(t.ids);
    const std::int64_t l = t.ids.size(1);
    // One read from the device for every check: id and type ranges, the last attended column.
    const at::Tensor last = (t.mask.ne(0).any(0).to(at::kLong) * at::arange(1, l + 1, t.ids.options())).max();
    const at::Tensor stats =
        at::stack({t.ids.min(), t.ids.max(), t.types.min(), t.types.max(), last, t.mask.min(), t.mask.max()})
            .to(at::kCPU);
    const auto s = stats.accessor<std::int64_t, 1>();
    TRAINER_CHECK_T(UsageError, s[5] >= 0 && s[6] <= 1, "model 'bert': an attention mask value of ",
                    s[5] < 0 ? s[5] : s[6], "; the mask is 1 for a token and 0 for padding");
    TRAINER_CHECK_T(UsageError, s[0] >= 0 && s[1] < a_.vocab, "model 'bert': a token id of ", s[0] < 0 ? s[0] : s[1],
                    " is outside the model's vocabulary of ", a_.vocab,
                    " (vocab_size): the tokenizer and the model must be the same model's");
    TRAINER_CHECK_T(UsageError, s[2] >= 0 && s[3] < a_.types, "model 'bert': a token type of ", s[2] < 0 ? s[2] : s[3],
                    " is outside the model's ", a_.types, " (type_vocab_size)");
    const std::int64_t keep = std::max<std::int64_t>(s[4], 1);
    const std::int64_t most = a_.layout == "roberta" ? a_.positions - a_.pad - 1 : a_.positions;
    TRAINER_CHECK_T(UsageError, keep <= most, "model 'bert': a sequence of ", keep, " tokens; the model takes at most ",
                    most, " (max_position_embeddings", a_.layout == "roberta" ? " less pad_token_id + 1" : "",
                    "): set dataset.max_length to at most that");
    if (keep < l) {
      t.ids = t.ids.narrow(1, 0, keep);
      t.mask = t.mask.narrow(1, 0, keep);
      t.types = t.types.narrow(1, 0, keep);
    }
    return t;
  }

  Arch a_;
  std::int64_t labels_;
  Json config_;
  std::set<std::string> base_names_;
  std::shared_ptr<Backbone> backbone_;
  std::shared_ptr<Linear> dense_;  ///< RoBERTa's classifier.dense
  std::shared_ptr<Linear> head_;
};

/// The model's name for a tensor of a transformers file, or nullopt for one it leaves out
/// (another head: cls.*, lm_head.*, ...; the position_ids buffer older files hold; a RoBERTa's
/// pooler, which its classification head does not use). Files of BertModel have bare names
/// (embeddings.*), of Bert*For* the "bert." prefix; TensorFlow-era files name LayerNorm's
/// parameters gamma and beta.
std::optional<std::string> model_name(std::string name, const std::string& prefix) {
  if (name.rfind(prefix + ".", 0) == 0) name = name.substr(prefix.size() + 1);
  if (prefix == "roberta" && name.rfind("pooler.", 0) == 0) return std::nullopt;
  for (const char* part : {"embeddings.", "encoder.", "pooler."}) {
    if (name.rfind(part, 0) == 0) {
      if (name == "embeddings.position_ids" || name == "embeddings.token_type_ids") return std::nullopt;
      for (const auto& [old, now] : {std::pair{".gamma", ".weight"}, std::pair{".beta", ".bias"}}) {
        const std::string from = std::string("LayerNorm") + old;
        if (name.size() >= from.size() && name.compare(name.size() - from.size(), from.size(), from) == 0) {
          name = name.substr(0, name.size() - std::strlen(old)) + now;
        }
      }
      return prefix + "." + name;
    }
  }
  if (name.rfind("classifier.", 0) == 0) return name;
  return std::nullopt;
}

/// The first names of `names` and how many there are, for a message.
std::string some(const std::vector<std::string>& names) {
  std::vector<std::string> first(names.begin(), names.begin() + std::min<std::size_t>(names.size(), 3));
  return fmt::format("{}{} ({})", fmt::join(first, ", "), names.size() > 3 ? ", ..." : "", names.size());
}

/// Loads the weights file of model directory `dir` into `model`: every tensor of the encoder must
/// be there with its shape; the pooler and the classifier are taken when there and of the
/// model's shape, and keep their initial values otherwise (a new head); the file's other heads
/// are left out. Logs what it did.
void load_pretrained(Model& model, const std::string& dir, const std::string& prefix) {
  std::string file = (fs::path(dir) / "model.safetensors").string();
  for (const char* index : {"model.safetensors.index.json", "pytorch_model.bin.index.json"}) {
    TRAINER_CHECK_T(UsageError, !fs::exists(fs::path(dir) / index), "model.path = \"", dir, "\": ", index,
                    " names a checkpoint split into shards, which trainer does not read yet; save it whole in Python: "
                    "model.save_pretrained(dir, max_shard_size=\"100GB\")");
  }
  if (!fs::exists(file)) file = (fs::path(dir) / "pytorch_model.bin").string();
  TRAINER_CHECK_T(UsageError, fs::exists(file), "model.path = \"", dir,
                  "\": no model.safetensors nor pytorch_model.bin; save_pretrained writes one of them");
  const detail::WeightsFile weights("model.path", file, /*checkpoints=*/false);
  std::map<std::string, std::string> file_name;  // model's name -> file's
  std::vector<std::string> left_out, fresh, missing, misshaped, unexpected;
  for (const auto& [name, t] : weights.tensors()) {
    const auto mine = model_name(name, prefix);
    if (!mine) {
      left_out.push_back(name);
      continue;
    }
    const auto [it, added] = file_name.emplace(*mine, name);
    TRAINER_CHECK_T(UsageError, added, "model.path: ", file, " holds both '", it->second, "' and '", name,
                    "', which are one tensor of the model (", *mine, ")");
  }
  std::map<std::string, at::Tensor> into;
  for (const auto& p : model.named_parameters(true)) into[p.key()] = p.value();
  for (const auto& b : model.named_buffers(true)) into[b.key()] = b.value();
  for (const auto& [name, t] : into) {
    const bool optional = name.rfind("classifier.", 0) == 0 || name.rfind(prefix + ".pooler.", 0) == 0;
    const auto it = file_name.find(name);
    if (it == file_name.end()) {
      (optional ? fresh : missing).push_back(name);
      continue;
    }
    const at::Tensor& from = weights.tensors().at(it->second);
    if (from.sizes() != t.sizes() || from.is_floating_point() != t.is_floating_point()) {
      if (optional) {
        fresh.push_back(name);
        file_name.erase(it);
        continue;
      }
      std::ostringstream shapes;
      shapes << from.sizes() << " " << c10::toString(from.scalar_type()) << ", model " << t.sizes();
      misshaped.push_back(fmt::format("{} (file {})", it->second, shapes.str()));
    }
  }
  for (const auto& [mine, theirs] : file_name) {
    if (!into.count(mine)) unexpected.push_back(theirs);
  }
  if (!missing.empty() || !misshaped.empty() || !unexpected.empty()) {
    std::string why;
    if (!misshaped.empty()) why += " mis-shaped: " + some(misshaped) + ";";
    if (!missing.empty()) why += " missing from the file: " + some(missing) + ";";
    if (!unexpected.empty()) why += " not in the model: " + some(unexpected) + ";";
    throw UsageError(
        fmt::format("model.path = \"{}\": {} does not fit the architecture of its config.json:{} a "
                    "config.json and weights saved together by save_pretrained fit",
                    dir, file, why));
  }
  std::int64_t loaded = 0;
  for (auto& [name, t] : into) {
    const auto it = file_name.find(name);
    if (it == file_name.end()) continue;
    weights.copy_into(it->second, t);
    ++loaded;
  }
  std::string note;
  if (!fresh.empty()) note += "; new (initialised here): " + some(fresh);
  if (!left_out.empty()) note += "; left out of the file: " + some(left_out);
  default_logger()->info("model bert: {} tensors from {} ({}){}", loaded, file, weights.format(), note);
}

}  // namespace

std::shared_ptr<Model> make_bert(const Config& section, const DataSpec& data) {
  const BertSettings s = BertSettings::from(section);
  const std::size_t dims = data.sample_shape.size();
  TRAINER_CHECK_T(UsageError, dims == 1 || (dims == 2 && (data.sample_shape[0] == 2 || data.sample_shape[0] == 3)),
                  "model 'bert' takes token sequences ([L], [2, L] or [3, L] per sample: ids, attention mask, token "
                  "types); the dataset's samples are [",
                  fmt::format("{}", fmt::join(data.sample_shape, ", ")), "]: use a text dataset");
  TRAINER_CHECK_T(UsageError, data.num_classes >= 1,
                  "model 'bert' needs the task's outputs per sample; the data "
                  "gives ",
                  data.num_classes);
  Arch a = arch_of(s);
  Json config;
  if (!s.path.empty()) {
    const auto set = architecture_keys_set(s);
    TRAINER_CHECK_T(UsageError, set.empty(), "model.", set.empty() ? "" : set.front(), " is set beside model.path = \"",
                    s.path,
                    "\", whose config.json gives the architecture; leave it "
                    "at its default");
    const ConfigJson file((fs::path(s.path) / "config.json").string());
    a = arch_of(file);
    config = file.json();
  }
  TRAINER_CHECK_T(UsageError, a.hidden % a.heads == 0, "model 'bert': hidden_size ", a.hidden,
                  " is not a multiple of num_attention_heads ", a.heads);
  TRAINER_CHECK_T(UsageError, a.pad < a.vocab, "model 'bert': pad_token_id ", a.pad, " is outside the vocabulary of ",
                  a.vocab);
  TRAINER_CHECK_T(UsageError, a.layout != "roberta" || a.positions > a.pad + 1,
                  "model 'bert': roberta's positions "
                  "start after pad_token_id ",
                  a.pad, "; max_position_embeddings ", a.positions, " leaves none");
  auto model = std::make_shared<Bert>(a, data.num_classes, std::move(config));
  if (!s.path.empty()) load_pretrained(*model, s.path, a.layout);
  return model;
}

bool save_hf_directory(Model& model, const std::string& dir) {
  auto* bert = dynamic_cast<Bert*>(&model);
  if (bert == nullptr) return false;
  if (!bert->plain()) {
    default_logger()->info("model bert: {} not written: the model has adapters (merge them first)", dir);
    return false;
  }
  fs::create_directories(dir);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& p : bert->named_parameters()) tensors[p.key()] = p.value();
  // transformers' from_pretrained reads a safetensors file only with this metadata.
  detail::write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  detail::write_atomic((fs::path(dir) / "config.json").string(), bert->hf_config().dump(2) + "\n");
  return true;
}

}  // namespace trainer
