#pragma once
// Private: the files of a Hugging Face model directory for model "bert": config.json read into
// an architecture and written back for an export, and the weights file read into the model
// under transformers' names.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/bert.h"

namespace trainer::detail {

/// The architecture, from config.json or the recipe's keys.
struct BertArch {
  std::string layout;  ///< "bert" or "roberta"
  std::int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, intermediate = 0, positions = 0, types = 0, pad = 0;
  std::string act;
  double hidden_dropout = 0, attention_dropout = 0, classifier_dropout = 0, eps = 0, init_range = 0;
};

/// The architecture of the recipe's keys.
BertArch bert_arch(const BertSettings& s);
/// The architecture keys set away from their defaults: beside model.path they would be ignored.
std::vector<std::string> bert_keys_set(const BertSettings& s);

/// A model directory's config.json: the architecture it describes (transformers' BertConfig and
/// RobertaConfig, their defaults where a key is absent) and the JSON itself. Throws UsageError
/// naming the file, the key and what is allowed.
struct BertConfigFile {
  BertArch arch;
  nlohmann::json json;
};
BertConfigFile read_bert_config(const std::string& file);

/// config.json for transformers' from_pretrained: `original` (the directory's, or null) with the
/// architecture's sizes, `labels` labels (-1: the masked-LM head, *ForMaskedLM) and `dtype`.
nlohmann::json bert_hf_config(const BertArch& a, std::int64_t labels, const nlohmann::json& original,
                              c10::ScalarType dtype);

/// Loads the weights file of model directory `dir` into `model` (whose names start with
/// `prefix`, "bert" or "roberta"): every tensor of the encoder must be there with its shape;
/// the head (BERT's pooler and the classifier, or with `masked_lm` the masked-LM head but its
/// tied decoder) is taken when there and of the model's shape, and otherwise initialised as
/// transformers initialises it (normal weights of std `init_range`, zero biases: a new head;
/// the model was built under DeferInit); the file's other heads, a pooler the model lacks and
/// a tied decoder are left out. Logs what it did. Throws UsageError naming the file.
void load_bert_weights(Model& model, const std::string& dir, const std::string& prefix, bool masked_lm,
                       double init_range);

}  // namespace trainer::detail
