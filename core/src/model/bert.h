#pragma once
// Private: model "bert", the BERT and RoBERTa encoders as Hugging Face's transformers builds
// them (BertForSequenceClassification, RobertaForSequenceClassification; BertForMaskedLM,
// RobertaForMaskedLM for a task with outputs per token): the same parameter names and
// computation, read from a model directory as save_pretrained writes it.
#include <map>
#include <memory>
#include <string>

#include "trainer/model.h"
#include "trainer/settings.h"

namespace trainer {

/// [model] of "bert". With `path`, the architecture is the directory's config.json and these
/// keys stay at their defaults; without, they describe an encoder trained from scratch. The
/// keys are config.json's names.
struct BertSettings : Settings<BertSettings> {
  std::string path;
  std::string layout = "bert";
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 256;
  std::int64_t num_hidden_layers = 4;
  std::int64_t num_attention_heads = 4;
  std::int64_t intermediate_size = 1024;
  std::int64_t max_position_embeddings = 512;
  std::int64_t type_vocab_size = 2;
  std::int64_t pad_token_id = -1;
  std::string hidden_act = "gelu";
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  double layer_norm_eps = 1e-12;
  double initializer_range = 0.02;
  bool trim_padding = true;

  static void declare(SettingsSchema<BertSettings>& s) {
    s.add(&BertSettings::path, "path",
          "A Hugging Face model directory (config.json and model.safetensors or pytorch_model.bin, as "
          "save_pretrained writes them): its architecture and weights, with a new head unless the file's fits; empty "
          "= an encoder from the keys below, trained from scratch");
    s.add(&BertSettings::layout, "layout",
          "bert (learned positions from 0, a pooler, token types) or roberta (positions after the padding id, no "
          "pooler); from config.json's model_type with path")
        .choices({"bert", "roberta"});
    s.add(&BertSettings::vocab_size, "vocab_size",
          "Token ids the embedding holds; 0 = the tokenizer's (a text dataset's id limit), else BERT's 30522")
        .min(0);
    s.add(&BertSettings::hidden_size, "hidden_size", "Token width (a multiple of num_attention_heads)").min(1);
    s.add(&BertSettings::num_hidden_layers, "num_hidden_layers",
          "Encoder layers (the blocks activation checkpointing wraps)")
        .min(1);
    s.add(&BertSettings::num_attention_heads, "num_attention_heads", "Attention heads per layer").min(1);
    s.add(&BertSettings::intermediate_size, "intermediate_size", "Hidden width of each layer's feed-forward").min(1);
    s.add(&BertSettings::max_position_embeddings, "max_position_embeddings",
          "Positions the embedding holds: the longest sequence (roberta: less pad_token_id + 1)")
        .min(1);
    s.add(&BertSettings::type_vocab_size, "type_vocab_size", "Token types (segments: 2 for BERT's sentence pairs)")
        .min(1);
    s.add(&BertSettings::pad_token_id, "pad_token_id",
          "The padding token's id: its embedding row gets no gradient; positions and, for [N, L] inputs, the "
          "attention mask follow it; -1 = the one a text dataset pads with, else 0")
        .min(-1);
    s.add(&BertSettings::hidden_act, "hidden_act", "The feed-forward's activation, as config.json names it")
        .choices({"gelu", "gelu_new", "gelu_pytorch_tanh", "relu"});
    s.add(&BertSettings::hidden_dropout_prob, "hidden_dropout_prob",
          "Dropout after the embeddings, each sublayer and before the classifier")
        .min(0)
        .max(1, false);
    s.add(&BertSettings::attention_probs_dropout_prob, "attention_probs_dropout_prob",
          "Dropout of the attention probabilities")
        .min(0)
        .max(1, false);
    s.add(&BertSettings::layer_norm_eps, "layer_norm_eps", "LayerNorm's epsilon").min(0, false);
    s.add(&BertSettings::initializer_range, "initializer_range",
          "Standard deviation of the normal that initialises weights and embeddings")
        .min(0, false);
    s.add(&BertSettings::trim_padding, "trim_padding",
          "Compute over the batch's longest sample: columns that are padding in every sample are cut (the same "
          "logits, less work); false: over the batch's full width, one shape per step with dataset.padding = "
          "\"max_length\" (what trainer estimate --lengths probes). Not an architecture key: it may go beside path");
  }
};

/// Builds model "bert" for `data` (token sequences [L], [2, L] or [3, L] per sample) from its
/// [model] section: from `path`'s config.json and weights, or from the keys. With
/// data.token_outputs, the masked-LM head (logits over the vocabulary per token) in place of
/// the classifier. Throws UsageError naming the key or file and what is allowed.
std::shared_ptr<Model> make_bert(const Config& section, const DataSpec& data);

/// Whether `model` is a model "bert".
bool is_bert(const Model& model);

/// When `model` is a model "bert": writes it to directory `dir` as a Hugging Face model
/// directory, config.json and model.safetensors (each durably), which transformers'
/// from_pretrained reads; returns true. The weights are the model's own, or with `merged` the
/// tensors of those names there (a LoRA model's weights with its adapters merged). A model
/// with adapters and no `merged`, or another model, writes nothing and returns false.
bool save_hf_directory(Model& model, const std::string& dir, const std::map<std::string, at::Tensor>* merged = nullptr);

/// The directory of a run that a model "bert" is exported to (see save_hf_directory).
inline constexpr const char* kHfModelDir = "hf_model";

}  // namespace trainer
