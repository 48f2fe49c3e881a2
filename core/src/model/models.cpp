#include <c10/core/DefaultDtype.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "model/bert.h"
#include "model/resnet.h"
#include "model/torchscript.h"
#include "model/vit.h"
#include "trainer/error.h"
#include "trainer/model.h"

namespace trainer {

namespace {

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

/// [model] of "mlp".
struct MlpSettings : Settings<MlpSettings> {
  std::vector<std::int64_t> hidden{256, 128};
  double dropout = 0.0;

  static void declare(SettingsSchema<MlpSettings>& s) {
    s.add(&MlpSettings::hidden, "hidden", "Hidden layer widths").min(1);
    s.add(&MlpSettings::dropout, "dropout", "Dropout after each hidden layer").min(0).max(1, false);
  }
};

/// Multi-layer perceptron on flattened inputs: [Linear → ReLU → Dropout] per hidden width,
/// then a Linear head.
class Mlp final : public Model {
 public:
  Mlp(const MlpSettings& o, const DataSpec& data) {
    std::int64_t in = numel_of(data.sample_shape);
    for (auto h : o.hidden) {
      body_->push_back(torch::nn::Linear(in, h));
      body_->push_back(torch::nn::ReLU());
      if (o.dropout > 0) body_->push_back(torch::nn::Dropout(o.dropout));
      in = h;
    }
    body_->push_back(torch::nn::Linear(in, data.num_classes));
    register_module("body", body_);
  }
  at::Tensor forward(const at::Tensor& x) override { return body_->forward(x.flatten(1)); }

 private:
  torch::nn::Sequential body_;
};

/// [model] of "cnn".
struct CnnSettings : Settings<CnnSettings> {
  std::vector<std::int64_t> channels{32, 64};
  std::int64_t hidden = 128;
  double dropout = 0.0;
  bool batch_norm = true;
  std::string memory_format = "contiguous";

  static void declare(SettingsSchema<CnnSettings>& s) {
    s.add(&CnnSettings::channels, "channels", "Conv widths, one 3x3 conv + 2x2 pool stage each").min(1);
    s.add(&CnnSettings::hidden, "hidden", "Width of the hidden fully-connected layer").min(1);
    s.add(&CnnSettings::dropout, "dropout", "Dropout before the head").min(0).max(1, false);
    s.add(&CnnSettings::batch_norm, "batch_norm", "BatchNorm after each conv");
    s.add(&CnnSettings::memory_format, "memory_format",
          "Conv weights and inputs as NCHW (contiguous) or NHWC (channels_last); auto: whichever a probe of a few "
          "forward+backward passes at the start of the run measures faster on this machine")
        .choices({"auto", "contiguous", "channels_last"});
  }
};

/// Small CNN: per channel width [Conv3x3 → (BatchNorm) → ReLU → MaxPool2], then
/// Linear(hidden) → ReLU → Dropout → Linear head.
class Cnn final : public Model {
 public:
  Cnn(const CnnSettings& o, const DataSpec& data) {
    TRAINER_CHECK(data.sample_shape.size() == 3, "model 'cnn' needs image samples [C, H, W], got ",
                  data.sample_shape.size(), " dimensions");
    std::int64_t c = data.sample_shape[0], h = data.sample_shape[1], w = data.sample_shape[2];
    for (auto out : o.channels) {
      features_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(c, out, 3).padding(1).bias(!o.batch_norm)));
      if (o.batch_norm) features_->push_back(torch::nn::BatchNorm2d(out));
      features_->push_back(torch::nn::ReLU());
      features_->push_back(torch::nn::MaxPool2d(2));
      c = out;
      h /= 2;
      w /= 2;
    }
    TRAINER_CHECK(h > 0 && w > 0, "model 'cnn': ", o.channels.size(), " pooling stages shrink a ", data.sample_shape[1],
                  "x", data.sample_shape[2], " image to nothing; use fewer model.channels");
    head_->push_back(torch::nn::Linear(c * h * w, o.hidden));
    head_->push_back(torch::nn::ReLU());
    if (o.dropout > 0) head_->push_back(torch::nn::Dropout(o.dropout));
    head_->push_back(torch::nn::Linear(o.hidden, data.num_classes));
    register_module("features", features_);
    register_module("head", head_);
  }
  at::Tensor forward(const at::Tensor& x) override { return head_->forward(features_->forward(x).flatten(1)); }

 private:
  torch::nn::Sequential features_, head_;
};

}  // namespace

at::Tensor Model::features(const at::Tensor&) {
  throw UsageError(
      "this model has no classification head to split off (Model::head_name() is empty); a linear probe needs a "
      "model with one (vit, resnet)");
}

void Model::train(bool on) {
  torch::nn::Module::train(on);
  if (on) {
    for (auto& m : kept_in_eval_) m->eval();
  }
}

void Model::keep_in_eval(std::shared_ptr<torch::nn::Module> module) {
  TRAINER_CHECK(module != nullptr, "Model::keep_in_eval: null module");
  if (is_training()) module->eval();
  kept_in_eval_.push_back(std::move(module));
}

c10::ScalarType model_dtype(const std::string& name) {
  if (name == "float32") return c10::kFloat;
  if (name == "float64") return c10::kDouble;
  if (name == "bfloat16") return c10::kBFloat16;
  throw ConfigError({"model.dtype = \"" + name + "\": allowed are float32, float64, bfloat16"});
}

std::shared_ptr<Model> build_model(const Config& section, const DataSpec& data) {
  const c10::ScalarType dtype = model_dtype(ModelSettings::from(section).dtype);
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
    r->add(
        "mlp",
        [](const Config& c, const DataSpec& d) -> std::shared_ptr<Model> {
          return std::make_shared<Mlp>(MlpSettings::from(c), d);
        },
        MlpSettings::keys(), "Multi-layer perceptron on flattened inputs");
    r->add(
        "cnn",
        [](const Config& c, const DataSpec& d) -> std::shared_ptr<Model> {
          return std::make_shared<Cnn>(CnnSettings::from(c), d);
        },
        CnnSettings::keys(), "Small convolutional network for images");
    r->add(
        "vit",
        [](const Config& c, const DataSpec& d) -> std::shared_ptr<Model> { return make_vit(VitSettings::from(c), d); },
        VitSettings::keys(), "Vision Transformer (torchvision's layout and parameter names; blocks exposed)");
    r->add(
        "resnet",
        [](const Config& c, const DataSpec& d) -> std::shared_ptr<Model> {
          return make_resnet(ResnetSettings::from(c), d);
        },
        ResnetSettings::keys(), "ResNet-18/34/50/101/152 (torchvision's layout and parameter names; blocks exposed)");
    r->add("bert", make_bert, BertSettings::keys(),
           "BERT or RoBERTa encoder for sequence classification (Hugging Face's layout, names and model directories; "
           "blocks exposed)");
    r->add("torchscript", load_torchscript_model, TorchScriptSettings::keys(),
           "A module written in Python and saved with torch.jit.script(model).save(path) (model.path)");
    return r;
  }();
  return *reg;
}

}  // namespace trainer
