// BERT (Devlin et al., 2019) and RoBERTa (Liu et al., 2019) as Hugging Face's transformers
// 4.x builds them for sequence classification and for masked language modelling: the parameter
// names, the shapes, the order of the operations (so that its weights load name for name and
// the logits agree to float rounding) and the initialisation of a model trained from scratch.
#include "model/bert.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include <spdlog/logger.h>
#include "model/bert_files.h"
#include "model/bert_modules.h"
#include "model/deferred_init.h"
#include "model/layer_norm.h"
#include "model/safetensors.h"
#include "trainer/error.h"
#include "trainer/layers.h"
#include "trainer/logging.h"
#include "util/durable_file.h"

namespace trainer {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using detail::BertArch;
using detail::LayerNorm;
using detail::bert::Backbone;
using detail::bert::linear;
using detail::bert::MaskedLmHead;

class Bert final : public Model {
 public:
  /// `config`: the config.json the architecture came from (null when from the recipe's keys).
  /// `masked_lm`: the masked-LM head (BertForMaskedLM, RobertaForMaskedLM) in place of the
  /// sequence classifier; `labels` is then unused.
  /// `trim`: cut columns that are padding in every sample (model.trim_padding).
  Bert(const BertArch& a, std::int64_t labels, Json config, bool masked_lm, bool trim)
      : a_(a), labels_(labels), masked_lm_(masked_lm), trim_(trim), config_(std::move(config)) {
    backbone_ = register_module(a.layout, std::make_shared<Backbone>(a, a.layout == "bert" && !masked_lm));
    if (masked_lm) {
      if (a.layout == "bert") {
        auto cls = register_module("cls", std::make_shared<torch::nn::Module>());
        lm_head_ = cls->register_module("predictions", std::make_shared<MaskedLmHead>(a));
      } else {
        lm_head_ = register_module("lm_head", std::make_shared<MaskedLmHead>(a));
      }
    } else if (a.layout == "bert") {
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
  nlohmann::json hf_config() const {
    return detail::bert_hf_config(a_, masked_lm_ ? -1 : labels_, config_, parameters()[0].scalar_type());
  }

  /// The names of the architecture's parameters, as built.
  const std::set<std::string>& base_names() const { return base_names_; }

  /// Whether the parameters are the architecture's own (no adapter added since it was built).
  bool plain() const {
    std::set<std::string> names;
    for (const auto& p : named_parameters()) names.insert(p.key());
    return names == base_names_;
  }

  /// Logits [N, labels], or with the masked-LM head over the vocabulary per token [N, L', vocab]
  /// (L': up to the batch's last attended token).
  at::Tensor forward(const at::Tensor& input) override {
    if (lm_head_) {
      const Tokens t = tokens(input);
      return lm_head_->forward(backbone_->forward(t.ids, t.mask, t.types), backbone_->words());
    }
    return head_->forward(features(input));
  }

  /// The sequence classifier's last layer; none for the masked-LM head (its decoder is the
  /// embeddings).
  std::string head_name() const override {
    if (lm_head_) return {};
    return a_.layout == "bert" ? "classifier" : "classifier.out_proj";
  }

  /// The head's input: BERT's pooled first token, RoBERTa's classifier.dense output (after
  /// their dropouts).
  at::Tensor features(const at::Tensor& input) override {
    if (lm_head_) return Model::features(input);  // no linear head to probe
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
  /// sequence of this batch (L' = its last attended position; L with trim_ off): a micro-batch
  /// of short sequences computes over its own length, whatever the batch was padded to.
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
    TRAINER_CHECK_T(UsageError, l > 0 && t.ids.size(0) > 0, "model 'bert': a batch of ", t.ids.size(0),
                    " sequences of ", l, " tokens; every sample needs at least one token");
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
    const std::int64_t keep = trim_ ? std::max<std::int64_t>(s[4], 1) : l;
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

  BertArch a_;
  std::int64_t labels_;
  bool masked_lm_, trim_;
  Json config_;
  std::set<std::string> base_names_;
  std::shared_ptr<Backbone> backbone_;
  std::shared_ptr<Linear> dense_;  ///< RoBERTa's classifier.dense
  std::shared_ptr<Linear> head_;
  std::shared_ptr<MaskedLmHead> lm_head_;
};

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
  BertArch a = detail::bert_arch(s);
  Json config;
  if (!s.path.empty()) {
    const auto set = detail::bert_keys_set(s);
    TRAINER_CHECK_T(UsageError, set.empty(), "model.", set.empty() ? "" : set.front(), " is set beside model.path = \"",
                    s.path,
                    "\", whose config.json gives the architecture; leave it "
                    "at its default");
    detail::BertConfigFile file = detail::read_bert_config((fs::path(s.path) / "config.json").string());
    TRAINER_CHECK_T(
        UsageError,
        !data.token_outputs || !file.json.contains("tie_word_embeddings") || file.json["tie_word_embeddings"] != false,
        s.path,
        "/config.json: tie_word_embeddings is false; trainer's masked-LM head decodes with the word "
        "embeddings (tied, as BERT and RoBERTa are published)");
    a = file.arch;
    config = std::move(file.json);
  }
  if (s.path.empty()) {
    // Sizes left to the data: a text dataset's tokenizer gives them.
    if (a.vocab == 0) a.vocab = data.token_id_limit > 0 ? data.token_id_limit : 30522;
    if (a.pad < 0) a.pad = data.pad_token_id >= 0 ? data.pad_token_id : 0;
  }
  const std::string from = s.path.empty() ? std::string("model.") : s.path + "/config.json: ";
  TRAINER_CHECK_T(UsageError, data.token_id_limit <= a.vocab, "model 'bert': ", from, "vocab_size ", a.vocab,
                  " does not cover the tokenizer's ids (up to ", data.token_id_limit - 1,
                  "): the tokenizer (dataset.tokenizer) is not this model's");
  TRAINER_CHECK_T(UsageError, data.pad_token_id < 0 || data.pad_token_id == a.pad, "model 'bert': ", from,
                  "pad_token_id ", a.pad, ", but the dataset pads with ", data.pad_token_id,
                  " (its tokenizer's padding token): the tokenizer (dataset.tokenizer) is not this model's");
  TRAINER_CHECK_T(UsageError, !data.token_outputs || data.num_classes <= a.vocab, "model 'bert': the task wants ",
                  data.num_classes, " logits per token; the masked-LM head gives one per id of the vocabulary (", from,
                  "vocab_size ", a.vocab, ")");
  TRAINER_CHECK_T(UsageError, a.hidden % a.heads == 0, "model 'bert': hidden_size ", a.hidden,
                  " is not a multiple of num_attention_heads ", a.heads);
  TRAINER_CHECK_T(UsageError, a.pad < a.vocab, "model 'bert': pad_token_id ", a.pad, " is outside the vocabulary of ",
                  a.vocab);
  TRAINER_CHECK_T(UsageError, a.layout != "roberta" || a.positions > a.pad + 1,
                  "model 'bert': roberta's positions "
                  "start after pad_token_id ",
                  a.pad, "; max_position_embeddings ", a.positions, " leaves none");
  std::shared_ptr<Bert> model;
  {
    // Weights the file then loads are not drawn at random first, and are made where the run
    // computes (detail::DeferInit, detail::LoadOnto): the file is read into them there.
    std::optional<detail::DeferInit> defer;
    if (!s.path.empty()) defer.emplace(detail::LoadOnto::device());
    model = std::make_shared<Bert>(a, data.num_classes, std::move(config), data.token_outputs, s.trim_padding);
  }
  if (!s.path.empty()) detail::load_bert_weights(*model, s.path, a.layout, data.token_outputs, a.init_range);
  return model;
}

bool is_bert(const Model& model) { return dynamic_cast<const Bert*>(&model) != nullptr; }

bool save_hf_directory(Model& model, const std::string& dir, const std::map<std::string, at::Tensor>* merged) {
  auto* bert = dynamic_cast<Bert*>(&model);
  if (bert == nullptr) return false;
  std::map<std::string, at::Tensor> tensors;
  if (merged != nullptr) {
    for (const auto& name : bert->base_names()) {
      const auto it = merged->find(name);
      TRAINER_CHECK(it != merged->end(), "model bert: the merged weights lack ", name);
      tensors[name] = it->second;
    }
  } else if (!bert->plain()) {
    default_logger()->info(
        "model bert: {} not written at this checkpoint: the model has adapters (a LoRA run writes it at its end "
        "with the adapters merged when plugins.lora.export_merged = true)",
        dir);
    return false;
  } else {
    for (const auto& p : bert->named_parameters()) tensors[p.key()] = p.value();
  }
  if (fs::path(dir).has_parent_path()) fs::create_directories(fs::path(dir).parent_path());
  make_run_subdir(dir);  // a link there (a run directory from elsewhere) is refused, not written through
  // transformers' from_pretrained reads a safetensors file only with this metadata.
  detail::write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  detail::write_atomic((fs::path(dir) / "config.json").string(), bert->hf_config().dump(2) + "\n");
  return true;
}

}  // namespace trainer
