#pragma once
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/export.h"
#include "trainer/registry.h"
#include "trainer/settings.h"

namespace trainer {

/// What a model needs to know about the data: one sample's shape (C,H,W or features) and the
/// number of classes.
struct DataSpec {
  std::vector<std::int64_t> sample_shape;
  /// A dataset's spec: its number of classes (0 when its targets are not classes). The spec a
  /// model is built with: the outputs per sample the task needs (trainer/task.h): the classes
  /// (classification), the labels (multilabel) or the targets (regression).
  std::int64_t num_classes = 0;
  /// A dataset of token ids (dataset "text"): its ids are below this (its tokenizer's id
  /// limit), which a model's vocabulary must cover; 0 for other data.
  std::int64_t token_id_limit = 0;
  /// The id its batches are padded with; -1 when it has none (other data).
  std::int64_t pad_token_id = -1;
  /// Per token: a dataset's spec sets it when its targets are per token (the dataset "text"
  /// with masked_lm: the hidden tokens [N, L]), which only a task with token_outputs() reads.
  /// The spec a model is built with sets it when the task wants outputs per token,
  /// [N, L, num_classes] for inputs of L tokens (Task::token_outputs(): masked language
  /// modelling), instead of [N, num_classes].
  bool token_outputs = false;
  /// A dataset's spec whose targets are whole numbers from 0 that declare no classes because one
  /// is too large to be a class index: why, naming the file, the line (or index) and the value,
  /// and the key that sets the classes. A task that needs classes refuses the data with it; a
  /// regression reads the numbers as values. Empty otherwise.
  std::string classes_refused = {};
};

/// The [model] keys the core reads whatever the model; `name` picks the registry entry, whose
/// keys join the section.
struct ModelSettings : Settings<ModelSettings> {
  std::string dtype = "float32";
  std::string weights;
  std::vector<std::string> weights_exclude;

  static void declare(SettingsSchema<ModelSettings>& s) {
    s.add(&ModelSettings::dtype, "dtype",
          "Dtype the parameters are created in (no float32 copy is made first); floating inputs are cast to it")
        .choices({"float32", "float64", "bfloat16"});
    s.add(&ModelSettings::weights, "weights",
          "Initial weights: a state_dict saved with torch.save (torchvision's names), a safetensors file or a "
          "trainer checkpoint; empty = the model's own initialisation");
    s.add(&ModelSettings::weights_exclude, "weights_exclude",
          "Name patterns (* wildcards) of tensors not taken from model.weights, e.g. [\"fc.*\"] for a new head");
  }
};

/// One repeated unit of a model (a transformer encoder layer, a residual block): one tensor in,
/// one tensor out. Models call their blocks through run(), never forward() directly, so that
/// a plugin can wrap every call (activation checkpointing does, in ModelCreated).
class TRAINER_API Block : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  virtual at::Tensor forward(const at::Tensor& x) = 0;

  /// How forward() is called when a wrapper is set: the wrapper gets the block and the input
  /// and must call block.forward(x) (or compute the same) itself.
  using Wrapper = std::function<at::Tensor(Block& block, const at::Tensor& x)>;
  /// forward(x), or the wrapper's call when one is set.
  at::Tensor run(const at::Tensor& x) { return wrapper_ ? wrapper_(*this, x) : forward(x); }
  /// Replaces how run() calls forward(); an empty Wrapper restores the plain call.
  void set_wrapper(Wrapper w) { wrapper_ = std::move(w); }
  bool wrapped() const { return static_cast<bool>(wrapper_); }

 private:
  Wrapper wrapper_;
};

/// A trainable model: a torch Module with a single-tensor forward returning logits [N, classes].
class TRAINER_API Model : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  virtual at::Tensor forward(const at::Tensor& input) = 0;
  /// The model's repeated units in forward order, for plugins that act per block (the
  /// grad_checkpoint plugin). Empty (the default) for models without such units. The model
  /// must call each through Block::run().
  virtual std::vector<std::shared_ptr<Block>> blocks() { return {}; }

  /// Name of the classification head (as in named_modules(): "heads.head" for the ViT, "fc"
  /// for the ResNet): the last layer, whose input is features(). Empty (the default) for
  /// models without that split; linear probes need it.
  virtual std::string head_name() const { return {}; }
  /// The head's input for `input` (the backbone's output). Models with a head_name() override
  /// it so that forward(x) computes head(features(x)); the default throws.
  virtual at::Tensor features(const at::Tensor& input);

  /// Module::train(on), after which the modules passed to keep_in_eval() are put back in eval
  /// mode when `on`: a frozen backbone keeps its BatchNorm statistics and skips its dropout
  /// while the rest trains.
  void train(bool on = true) override;
  /// Keeps `module` (a part of this model) in eval mode from now on whatever train() is told.
  void keep_in_eval(std::shared_ptr<torch::nn::Module> module);

 private:
  std::vector<std::shared_ptr<torch::nn::Module>> kept_in_eval_;
};

/// What load_weights() did.
struct WeightsReport {
  std::string format;                 ///< "torch.save state_dict", "safetensors" or "trainer checkpoint"
  std::int64_t loaded = 0;            ///< parameters and buffers taken from the file
  std::vector<std::string> excluded;  ///< the model's tensors left at their initial values
};

/// Loads the tensors of `file` into `model` by name: a state_dict saved in Python with
/// torch.save (the dict itself, or its "state_dict" or "model" entry; a "module." prefix on
/// every name is dropped), a safetensors file (read a chunk at a time into the model's tensors,
/// with no whole copy of the file in memory), or a checkpoint trainer wrote (its model). Every parameter and
/// buffer whose name matches none of `exclude` (fnmatch patterns) must be in the file with the
/// same shape, and the file may hold nothing else outside `exclude`; otherwise throws
/// UsageError naming the file, the first mis-shaped, missing and unexpected names and their
/// counts, and changes nothing. Values are converted to each tensor's dtype and device.
TRAINER_API WeightsReport load_weights(Model& model, const std::string& file,
                                       const std::vector<std::string>& exclude = {});

/// Builds a model from its config section (`model.*`) and the data spec.
using ModelFactory = std::function<std::shared_ptr<Model>(const Config& section, const DataSpec& data)>;

/// The process-wide model registry (built-ins: "mlp", "cnn", "vit", "resnet", "bert", "torchscript").
TRAINER_API Registry<ModelFactory>& model_registry();

/// The dtype named by `model.dtype`: "float32", "float64" or "bfloat16" (throws ConfigError
/// for anything else).
TRAINER_API c10::ScalarType model_dtype(const std::string& name);

/// Builds the model `section.name` with its parameters and buffers created directly in
/// `section.dtype` (default float32): LibTorch's default dtype is switched for the
/// construction, so no float32 copy is made and converted. Peak memory of the build is the
/// parameters themselves.
TRAINER_API std::shared_ptr<Model> build_model(const Config& section, const DataSpec& data);

}  // namespace trainer
