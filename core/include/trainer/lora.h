#pragma once
// LoRA (Hu et al., 2021): low-rank adapters on a frozen model's linear and convolution
// layers, their merge into the weights, and the small files that hold them.
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/export.h"
#include "trainer/model.h"

namespace trainer {

/// How apply_lora() adapts a model (the `lora` plugin's keys).
struct LoraOptions {
  std::int64_t rank = 8;
  double alpha = 16.0;   ///< the adapter's term is scaled by alpha / rank
  double dropout = 0.0;  ///< dropout on the adapter's input, in training mode
  /// fnmatch patterns of layer names (as in named_modules()) to adapt: Linear and Conv2d
  /// layers of trainer/layers.h, e.g. "*.self_attention.q_proj". Every pattern must match.
  std::vector<std::string> targets;
  /// fnmatch patterns of parameter names that keep training besides the adapters (a new
  /// head: "heads.*", "fc.*"). Every pattern must match.
  std::vector<std::string> trainable;
};

/// What apply_lora() did.
struct LoraReport {
  std::vector<std::string> adapted;       ///< layer names, in the model's order
  std::int64_t adapter_parameters = 0;    ///< elements of the adapters' A and B
  std::int64_t trainable_parameters = 0;  ///< adapters plus the `trainable` parameters
  std::int64_t frozen_parameters = 0;     ///< everything else (requires_grad now false)
};

/// Attaches a LoRA adapter to every layer whose name matches a target: the child module
/// "lora" with A [rank, in] (Kaiming uniform, as nn.Linear) and B [out, rank] (zeros), the
/// layer's output becoming base(x) + (alpha / rank) * B A dropout(x); on a Conv2d, A is a conv
/// of the layer's kernel, stride and padding to `rank` channels and B a 1x1 conv. Since B is
/// zero the model computes what it did. Then freezes (requires_grad = false) every parameter
/// that is neither an adapter's nor matched by `trainable`. Throws UsageError for rank < 1,
/// alpha <= 0, dropout outside [0, 1), no target, a pattern matching nothing (naming the
/// adaptable layers there are), or a layer adapted already.
TRAINER_API LoraReport apply_lora(Model& model, const LoraOptions& options);

/// Merges every adapter into its layer's weight (W += (alpha / rank) B A): the same outputs
/// without the adapters' matmuls. Returns the layers merged.
TRAINER_API std::int64_t merge_adapters(Model& model);
/// Undoes merge_adapters() (up to rounding in the weights' dtype). Returns the layers unmerged.
TRAINER_API std::int64_t unmerge_adapters(Model& model);

/// Writes what a LoRA run trained: every adapter's A and B, every other parameter that
/// requires grad (the new head) and every buffer of the model (BatchNorm's running statistics,
/// which move while the adapters train in train mode), by name, with the adapters' rank and
/// alpha and the digest of the frozen parameters they apply to ("frozen_base"). A TorchScript
/// archive (torch.jit.load(file).tensors.state_dict() in Python), written durably. Returns the
/// number of tensors written.
/// `frozen_base`: that digest as the caller computed it (frozen_base_digest, once per run: it
/// reads every frozen weight); "" = computed here.
TRAINER_API std::int64_t save_adapters(Model& model, const std::string& file, const std::string& frozen_base = "");

/// A digest of the model's frozen parameters (those that do not require grad): their names,
/// dtypes, shapes and values, whatever the device and memory format, as
/// "frozen-digest-v1:<16 hex digits> (<n> tensors, <m> elements)". Adapter files and the
/// checkpoints of runs that train part of their model record it, and are applied only over
/// frozen weights with the same digest.
TRAINER_API std::string frozen_base_digest(Model& model);

/// Loads a file of save_adapters() into a model adapted the same way (apply_lora with the
/// same targets, rank and alpha, adapters not merged): every tensor of the file must name one
/// of the model's adapter or trainable parameters or buffers with the same shape, and each of
/// them must be in the file, and the model's frozen parameters must have the digest the file
/// records (a file without one, written before files recorded it, is taken as it is). Throws
/// UsageError naming the file and the first mismatch (or both digests), changing nothing.
/// Returns the number of tensors loaded.
TRAINER_API std::int64_t load_adapters(Model& model, const std::string& file);

/// Writes the model's parameters and buffers with every adapter merged in and no adapter
/// tensor: a file that model.weights loads into the plain model (a trainer checkpoint's
/// "model" entry) and Python reads with torch.jit.load(file).model.state_dict(). The model is
/// left as it was. Written durably. Returns the number of tensors written.
TRAINER_API std::int64_t save_merged_model(Model& model, const std::string& file);

/// For a model with a Hugging Face layout (model "bert"): writes directory `dir` as
/// transformers' save_pretrained would, config.json and model.safetensors, with the adapters
/// merged into the weights (as PEFT's merge_and_unload then save_pretrained); the model is
/// left as it is. Returns false, writing nothing, for other models. A `dir` that is a symbolic
/// link or a file is refused (UsageError naming it); the files go through temporaries created
/// new (trainer/durable_file.h).
TRAINER_API bool save_merged_hf_directory(Model& model, const std::string& dir);

}  // namespace trainer
