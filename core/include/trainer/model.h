#pragma once
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "trainer/config.h"
#include "trainer/export.h"
#include "trainer/registry.h"

namespace trainer {

/// What a model needs to know about the data: one sample's shape (C,H,W or features) and the
/// number of classes.
struct DataSpec {
  std::vector<std::int64_t> sample_shape;
  std::int64_t num_classes = 0;
};

/// A trainable model: a torch Module with a single-tensor forward returning logits [N, classes].
class TRAINER_API Model : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  virtual at::Tensor forward(const at::Tensor& input) = 0;
};

/// Builds a model from its config section (`model.*`) and the data spec.
using ModelFactory = std::function<std::shared_ptr<Model>(const Config& section, const DataSpec& data)>;

/// The process-wide model registry (built-ins: "mlp", "cnn").
TRAINER_API Registry<ModelFactory>& model_registry();

}  // namespace trainer
