#include <c10/core/DefaultDtype.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "trainer/error.h"
#include "trainer/model.h"

namespace trainer {

namespace {

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

/// Multi-layer perceptron on flattened inputs: [Linear → ReLU → Dropout] per hidden width,
/// then a Linear head.
class Mlp final : public Model {
 public:
  Mlp(const std::vector<std::int64_t>& hidden, double dropout, const DataSpec& data) {
    std::int64_t in = numel_of(data.sample_shape);
    for (auto h : hidden) {
      body_->push_back(torch::nn::Linear(in, h));
      body_->push_back(torch::nn::ReLU());
      if (dropout > 0) body_->push_back(torch::nn::Dropout(dropout));
      in = h;
    }
    body_->push_back(torch::nn::Linear(in, data.num_classes));
    register_module("body", body_);
  }
  at::Tensor forward(const at::Tensor& x) override { return body_->forward(x.flatten(1)); }

 private:
  torch::nn::Sequential body_;
};

/// Small CNN: per channel width [Conv3x3 → (BatchNorm) → ReLU → MaxPool2], then
/// Linear(hidden) → ReLU → Dropout → Linear head.
class Cnn final : public Model {
 public:
  Cnn(const std::vector<std::int64_t>& channels, std::int64_t hidden, double dropout, bool batch_norm,
      const DataSpec& data) {
    TRAINER_CHECK(data.sample_shape.size() == 3, "model 'cnn' needs image samples [C, H, W], got ",
                  data.sample_shape.size(), " dimensions");
    std::int64_t c = data.sample_shape[0], h = data.sample_shape[1], w = data.sample_shape[2];
    for (auto out : channels) {
      features_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(c, out, 3).padding(1).bias(!batch_norm)));
      if (batch_norm) features_->push_back(torch::nn::BatchNorm2d(out));
      features_->push_back(torch::nn::ReLU());
      features_->push_back(torch::nn::MaxPool2d(2));
      c = out;
      h /= 2;
      w /= 2;
    }
    TRAINER_CHECK(h > 0 && w > 0, "model 'cnn': ", channels.size(), " pooling stages shrink a ", data.sample_shape[1],
                  "x", data.sample_shape[2], " image to nothing; use fewer model.channels");
    head_->push_back(torch::nn::Linear(c * h * w, hidden));
    head_->push_back(torch::nn::ReLU());
    if (dropout > 0) head_->push_back(torch::nn::Dropout(dropout));
    head_->push_back(torch::nn::Linear(hidden, data.num_classes));
    register_module("features", features_);
    register_module("head", head_);
  }
  at::Tensor forward(const at::Tensor& x) override { return head_->forward(features_->forward(x).flatten(1)); }

 private:
  torch::nn::Sequential features_, head_;
};

}  // namespace

c10::ScalarType model_dtype(const std::string& name) {
  if (name == "float32") return c10::kFloat;
  if (name == "float64") return c10::kDouble;
  if (name == "bfloat16") return c10::kBFloat16;
  throw ConfigError({"model.dtype = \"" + name + "\": allowed are float32, float64, bfloat16"});
}

std::shared_ptr<Model> build_model(const Config& section, const DataSpec& data) {
  const c10::ScalarType dtype = model_dtype(section.get_or<std::string>("dtype", "float32"));
  const auto factory = model_registry().get(section.get<std::string>("name")).factory;
  // Restores the previous default dtype however the factory exits.
  struct DefaultDtype {
    caffe2::TypeMeta previous = c10::get_default_dtype();
    explicit DefaultDtype(c10::ScalarType t) { c10::set_default_dtype(caffe2::TypeMeta::fromScalarType(t)); }
    ~DefaultDtype() { c10::set_default_dtype(previous); }
  } guard(dtype);
  return factory(section, data);
}

Registry<ModelFactory>& model_registry() {
  static Registry<ModelFactory>* reg = [] {
    auto* r = new Registry<ModelFactory>("model");
    using T = ValueType;
    r->add(
        "mlp",
        [](const Config& c, const DataSpec& d) -> std::shared_ptr<Model> {
          return std::make_shared<Mlp>(c.get<std::vector<std::int64_t>>("hidden"), c.get<double>("dropout"), d);
        },
        {KeySpec("hidden", T::IntList, "Hidden layer widths").def(std::vector<std::int64_t>{256, 128}).min(1),
         KeySpec("dropout", T::Float, "Dropout after each hidden layer").def(0.0).min(0).max(1, false)},
        "Multi-layer perceptron on flattened inputs");
    r->add(
        "cnn",
        [](const Config& c, const DataSpec& d) -> std::shared_ptr<Model> {
          return std::make_shared<Cnn>(c.get<std::vector<std::int64_t>>("channels"), c.get<std::int64_t>("hidden"),
                                       c.get<double>("dropout"), c.get<bool>("batch_norm"), d);
        },
        {KeySpec("channels", T::IntList, "Conv widths, one 3x3 conv + 2x2 pool stage each")
             .def(std::vector<std::int64_t>{32, 64})
             .min(1),
         KeySpec("hidden", T::Int, "Width of the hidden fully-connected layer").def(std::int64_t{128}).min(1),
         KeySpec("dropout", T::Float, "Dropout before the head").def(0.0).min(0).max(1, false),
         KeySpec("batch_norm", T::Bool, "BatchNorm after each conv").def(true)},
        "Small convolutional network for images");
    return r;
  }();
  return *reg;
}

}  // namespace trainer
