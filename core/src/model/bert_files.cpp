// The files of a Hugging Face model directory for model "bert" (model/bert_files.h).
#include "model/bert_files.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/logger.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "model/weights_file.h"
#include "trainer/error.h"
#include "trainer/json.h"
#include "trainer/logging.h"

namespace trainer::detail {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

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
BertArch arch_of(const ConfigJson& c) {
  BertArch a;
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

/// TensorFlow-era files name LayerNorm's parameters gamma and beta.
std::string modern_norm(std::string name) {
  for (const auto& [old, now] : {std::pair{".gamma", ".weight"}, std::pair{".beta", ".bias"}}) {
    const std::string from = std::string("LayerNorm") + old;
    if (name.size() >= from.size() && name.compare(name.size() - from.size(), from.size(), from) == 0) {
      name = name.substr(0, name.size() - std::strlen(old)) + now;
    }
  }
  return name;
}

bool starts(const std::string& s, const std::string& with) { return s.rfind(with, 0) == 0; }

/// The model's name for a tensor of a transformers file, or nullopt for one it leaves out
/// (another head: cls.*, lm_head.*, classifier.* for the other; the position_ids buffer older
/// files hold; a pooler, which a RoBERTa and a masked-LM model do not use; a masked-LM
/// decoder, tied to the embeddings). Files of BertModel have bare names (embeddings.*), of
/// Bert*For* the "bert." prefix.
std::optional<std::string> model_name(std::string name, const std::string& prefix, bool masked_lm) {
  if (masked_lm) {
    const std::string head = prefix == "bert" ? "cls.predictions." : "lm_head.";
    if (!starts(name, head)) {
      // the encoder's, below
    } else if (starts(name, head + "decoder.")) {
      return std::nullopt;
    } else {
      return modern_norm(name);
    }
  }
  if (starts(name, prefix + ".")) name = name.substr(prefix.size() + 1);
  if ((prefix == "roberta" || masked_lm) && starts(name, "pooler.")) return std::nullopt;
  for (const char* part : {"embeddings.", "encoder.", "pooler."}) {
    if (starts(name, part)) {
      if (name == "embeddings.position_ids" || name == "embeddings.token_type_ids") return std::nullopt;
      return prefix + "." + modern_norm(name);
    }
  }
  if (!masked_lm && starts(name, "classifier.")) return name;
  return std::nullopt;
}

/// The first names of `names` and how many there are, for a message.
std::string some(const std::vector<std::string>& names) {
  std::vector<std::string> first(names.begin(), names.begin() + std::min<std::size_t>(names.size(), 3));
  return fmt::format("{}{} ({})", fmt::join(first, ", "), names.size() > 3 ? ", ..." : "", names.size());
}

}  // namespace

BertArch bert_arch(const BertSettings& s) {
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
std::vector<std::string> bert_keys_set(const BertSettings& s) {
  const BertSettings d;
  const BertArch a = bert_arch(s), b = bert_arch(d);
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

BertConfigFile read_bert_config(const std::string& file) {
  const ConfigJson c(file);
  return {arch_of(c), c.json()};
}

Json bert_hf_config(const BertArch& a, std::int64_t labels, const Json& original, c10::ScalarType dtype) {
  Json c = original.is_object() ? original : Json::object();
  const bool bert = a.layout == "bert";
  const bool masked_lm = labels < 0;
  if (masked_lm) {
    c["architectures"] = {bert ? "BertForMaskedLM" : "RobertaForMaskedLM"};
  } else {
    c["architectures"] = {bert ? "BertForSequenceClassification" : "RobertaForSequenceClassification"};
  }
  if (!c.contains("model_type")) c["model_type"] = a.layout;
  c["vocab_size"] = a.vocab;
  c["hidden_size"] = a.hidden;
  c["num_hidden_layers"] = a.layers;
  c["num_attention_heads"] = a.heads;
  c["intermediate_size"] = a.intermediate;
  c["max_position_embeddings"] = a.positions;
  c["type_vocab_size"] = a.types;
  c["pad_token_id"] = a.pad;
  c["hidden_act"] = a.act;
  c["hidden_dropout_prob"] = a.hidden_dropout;
  c["attention_probs_dropout_prob"] = a.attention_dropout;
  c["classifier_dropout"] = a.classifier_dropout;
  c["layer_norm_eps"] = a.eps;
  c["initializer_range"] = a.init_range;
  c["position_embedding_type"] = "absolute";
  if (masked_lm) {
    // A classifier's labels (of the directory it came from) say nothing about this model.
    c.erase("id2label");
    c.erase("label2id");
  } else {
    Json id2label = Json::object(), label2id = Json::object();
    for (std::int64_t i = 0; i < labels; ++i) {
      id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
      label2id["LABEL_" + std::to_string(i)] = i;
    }
    c["id2label"] = id2label;
    c["label2id"] = label2id;
  }
  c["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kDouble ? "float64" : "float32";
  return c;
}

/// Loads the weights file of model directory `dir` into `model`: every tensor of the encoder must
/// be there with its shape; the pooler and the classifier are taken when there and of the
/// model's shape, and initialised here otherwise (a new head; the model was built under
/// DeferInit); the file's other heads are left out. Logs what it did.
void load_bert_weights(Model& model, const std::string& dir, const std::string& prefix, bool masked_lm,
                       double init_range) {
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
    const auto mine = model_name(name, prefix, masked_lm);
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
    const bool optional = starts(name, "classifier.") || starts(name, prefix + ".pooler.") || starts(name, "cls.") ||
                          starts(name, "lm_head.");
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
  // The model was built without initialising (DeferInit): what the file lacks is initialised
  // now, as transformers' _init_weights does (normal weights, zero biases, LayerNorm ones).
  // The random weights are drawn from the CPU generator wherever the model is, so that a run's
  // new head is the same on every device for one seed.
  {
    at::NoGradGuard no_grad;
    for (const auto& name : fresh) {
      at::Tensor& t = into.at(name);
      if (t.dim() >= 2) {
        t.copy_(at::empty(t.sizes(), t.options().device(at::kCPU)).normal_(0.0, init_range));
      } else if (name.size() >= 7 && name.compare(name.size() - 7, 7, ".weight") == 0) {
        t.fill_(1.0);  // a LayerNorm's
      } else {
        t.zero_();
      }
    }
  }
  std::string note;
  if (!fresh.empty()) note += "; new (initialised here): " + some(fresh);
  if (!left_out.empty()) note += "; left out of the file: " + some(left_out);
  default_logger()->info("model bert: {} tensors from {} ({}){}", loaded, file, weights.format(), note);
}

}  // namespace trainer::detail
