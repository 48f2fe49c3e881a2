// ResNet (He et al., 2016) as torchvision builds it: module names, shapes and initialisation
// follow torchvision.models.ResNet, so that its state_dicts map onto this model name for name.
#include "model/resnet.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>

#include <array>
#include <string>

#include "trainer/error.h"
#include "trainer/layers.h"

namespace trainer {

namespace {

std::shared_ptr<Conv2d> conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride) {
  return std::make_shared<Conv2d>(in, out, kernel, stride, kernel / 2, /*bias=*/false);
}

/// torchvision's downsample: a 1x1 conv of the block's stride and a BatchNorm, at Sequential
/// positions 0 and 1 (their parameter names).
torch::nn::Sequential downsample(std::int64_t in, std::int64_t out, std::int64_t stride) {
  torch::nn::Sequential s;
  s->push_back(conv(in, out, 1, stride));
  s->push_back(torch::nn::BatchNorm2d(out));
  return s;
}

/// Two 3x3 convs (ResNet-18/34): relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
class BasicBlock final : public Block {
 public:
  static constexpr std::int64_t kExpansion = 1;
  BasicBlock(std::int64_t in, std::int64_t planes, std::int64_t stride) {
    conv1_ = register_module("conv1", conv(in, planes, 3, stride));
    bn1_ = register_module("bn1", torch::nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", conv(planes, planes, 3, 1));
    bn2_ = register_module("bn2", torch::nn::BatchNorm2d(planes));
    if (stride != 1 || in != planes) downsample_ = register_module("downsample", downsample(in, planes, stride));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor out = at::relu(bn1_->forward(conv1_->forward(x)));
    out = bn2_->forward(conv2_->forward(out));
    return at::relu(out + (downsample_ ? downsample_->forward(x) : x));
  }
  /// The residual branch's last BatchNorm (zero_init_residual).
  torch::nn::BatchNorm2d last_bn() const { return bn2_; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  torch::nn::Sequential downsample_{nullptr};
};

/// 1x1 reduce, 3x3 (carrying the stride, "v1.5"), 1x1 expand by 4 (ResNet-50/101/152).
class Bottleneck final : public Block {
 public:
  static constexpr std::int64_t kExpansion = 4;
  Bottleneck(std::int64_t in, std::int64_t planes, std::int64_t stride) {
    conv1_ = register_module("conv1", conv(in, planes, 1, 1));
    bn1_ = register_module("bn1", torch::nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", conv(planes, planes, 3, stride));
    bn2_ = register_module("bn2", torch::nn::BatchNorm2d(planes));
    conv3_ = register_module("conv3", conv(planes, planes * kExpansion, 1, 1));
    bn3_ = register_module("bn3", torch::nn::BatchNorm2d(planes * kExpansion));
    if (stride != 1 || in != planes * kExpansion) {
      downsample_ = register_module("downsample", downsample(in, planes * kExpansion, stride));
    }
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor out = at::relu(bn1_->forward(conv1_->forward(x)));
    out = at::relu(bn2_->forward(conv2_->forward(out)));
    out = bn3_->forward(conv3_->forward(out));
    return at::relu(out + (downsample_ ? downsample_->forward(x) : x));
  }
  torch::nn::BatchNorm2d last_bn() const { return bn3_; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_, conv3_;
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  torch::nn::Sequential downsample_{nullptr};
};

class Resnet final : public Model {
 public:
  Resnet(const ResnetSettings& o, const DataSpec& data) : imagenet_stem_(o.stem == "imagenet") {
    TRAINER_CHECK_T(UsageError, data.sample_shape.size() == 3, "model 'resnet' needs image samples [C, H, W], got ",
                    data.sample_shape.size(), " dimensions");
    std::array<std::int64_t, 4> counts{};
    bool bottleneck = false;
    switch (o.depth) {
      case 18:
        counts = {2, 2, 2, 2};
        break;
      case 34:
        counts = {3, 4, 6, 3};
        break;
      case 50:
        counts = {3, 4, 6, 3};
        bottleneck = true;
        break;
      case 101:
        counts = {3, 4, 23, 3};
        bottleneck = true;
        break;
      case 152:
        counts = {3, 8, 36, 3};
        bottleneck = true;
        break;
      default:
        throw UsageError(fmt::format("model.depth = {}: allowed are 18, 34, 50, 101, 152", o.depth));
    }
    const std::int64_t channels = data.sample_shape[0];
    conv1_ = register_module("conv1", imagenet_stem_ ? conv(channels, 64, 7, 2) : conv(channels, 64, 3, 1));
    bn1_ = register_module("bn1", torch::nn::BatchNorm2d(64));
    std::int64_t in = 64;
    const std::array<std::int64_t, 4> planes{64, 128, 256, 512};
    for (std::size_t l = 0; l < 4; ++l) {
      auto layer = register_module("layer" + std::to_string(l + 1), std::make_shared<torch::nn::Module>());
      for (std::int64_t b = 0; b < counts[l]; ++b) {
        const std::int64_t stride = (b == 0 && l > 0) ? 2 : 1;
        std::shared_ptr<Block> block;
        torch::nn::BatchNorm2d last{nullptr};
        if (bottleneck) {
          auto blk = std::make_shared<Bottleneck>(in, planes[l], stride);
          last = blk->last_bn();
          block = blk;
          in = planes[l] * Bottleneck::kExpansion;
        } else {
          auto blk = std::make_shared<BasicBlock>(in, planes[l], stride);
          last = blk->last_bn();
          block = blk;
          in = planes[l] * BasicBlock::kExpansion;
        }
        blocks_.push_back(layer->register_module(std::to_string(b), block));
        last_bns_.push_back(last);
      }
    }
    fc_ = register_module("fc", std::make_shared<Linear>(in, data.num_classes));

    // As torchvision: Kaiming normal (fan_out, ReLU) for every conv; BatchNorm at (1, 0); the
    // fc keeps nn.Linear's default initialisation.
    at::NoGradGuard no_grad;
    for (const auto& m : modules(/*include_self=*/false)) {
      if (auto* c = m->as<Conv2d>()) {
        torch::nn::init::kaiming_normal_(c->weight(), 0.0, torch::kFanOut, torch::kReLU);
      }
    }
    if (o.zero_init_residual) {
      for (auto& bn : last_bns_) bn->weight.zero_();
    }
  }

  at::Tensor forward(const at::Tensor& input) override { return fc_->forward(features(input)); }

  std::string head_name() const override { return "fc"; }
  /// The last stage's output averaged over space: [N, 512 x expansion].
  at::Tensor features(const at::Tensor& input) override {
    at::Tensor x = at::relu(bn1_->forward(conv1_->forward(input)));
    if (imagenet_stem_) x = at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
    for (const auto& b : blocks_) x = b->run(x);
    return at::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  }

  std::vector<std::shared_ptr<Block>> blocks() override { return blocks_; }

 private:
  bool imagenet_stem_;
  std::shared_ptr<Conv2d> conv1_;
  torch::nn::BatchNorm2d bn1_{nullptr};
  std::vector<std::shared_ptr<Block>> blocks_;
  std::vector<torch::nn::BatchNorm2d> last_bns_;
  std::shared_ptr<Linear> fc_;
};

}  // namespace

std::shared_ptr<Model> make_resnet(const ResnetSettings& settings, const DataSpec& data) {
  return std::make_shared<Resnet>(settings, data);
}

}  // namespace trainer
