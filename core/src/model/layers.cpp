#include "trainer/layers.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <cmath>

#include "model/deferred_init.h"
#include "trainer/error.h"

namespace trainer {

namespace detail {

namespace {
thread_local bool deferring = false;
thread_local c10::Device deferred_device(c10::kCPU);
thread_local c10::Device load_device(c10::kCPU);
}  // namespace

DeferInit::DeferInit(c10::Device device) : before_(deferring), device_before_(deferred_device) {
  deferring = true;
  deferred_device = device;
}
DeferInit::~DeferInit() {
  deferring = before_;
  deferred_device = device_before_;
}
bool DeferInit::active() { return deferring; }
c10::TensorOptions DeferInit::options() {
  return c10::TensorOptions().device(deferring ? deferred_device : c10::Device(c10::kCPU));
}

LoadOnto::LoadOnto(c10::Device device) : before_(load_device) { load_device = device; }
LoadOnto::~LoadOnto() { load_device = before_; }
c10::Device LoadOnto::device() { return load_device; }

}  // namespace detail

namespace {

/// torch::nn::Linear's and Conv2d's reset_parameters(): Kaiming uniform (a = sqrt(5)) for the
/// weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias, drawn in that order.
void init_like_torch_nn(at::Tensor& weight, at::Tensor& bias) {
  if (detail::DeferInit::active()) return;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const auto fans = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    const double bound = 1.0 / std::sqrt(static_cast<double>(std::get<0>(fans)));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

}  // namespace

void AdaptableLayer::set_adapter(const std::string& name, std::shared_ptr<Adapter> adapter) {
  TRAINER_CHECK(adapter != nullptr, "set_adapter: null adapter");
  TRAINER_CHECK(adapter_ == nullptr, "this layer has an adapter already; a layer takes one");
  adapter_ = register_module(name, std::move(adapter));
}

void AdaptableLayer::merge() {
  if (!adapter_ || merged_) return;
  at::NoGradGuard no_grad;
  weight().add_(adapter_->delta_weight());
  merged_ = true;
}

void AdaptableLayer::unmerge() {
  if (!adapter_ || !merged_) return;
  at::NoGradGuard no_grad;
  weight().sub_(adapter_->delta_weight());
  merged_ = false;
}

at::Tensor AdaptableLayer::adapt(const at::Tensor& y, const at::Tensor& x) {
  if (!adapter_ || merged_) return y;
  return y + adapter_->forward(x);
}

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias) : in_(in_features), out_(out_features) {
  weight_ = register_parameter("weight", at::empty({out_features, in_features}, detail::DeferInit::options()));
  if (bias) bias_ = register_parameter("bias", at::empty({out_features}, detail::DeferInit::options()));
  at::NoGradGuard no_grad;
  init_like_torch_nn(weight_, bias_);
}

std::shared_ptr<Linear> Linear::part_of(at::Tensor weight, at::Tensor bias, std::int64_t begin, std::int64_t rows) {
  TRAINER_CHECK(weight.dim() == 2 && begin >= 0 && rows > 0 && begin + rows <= weight.size(0),
                "Linear::part_of: rows [", begin, ", ", begin + rows, ") of a weight of shape ", weight.sizes());
  TRAINER_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
                "Linear::part_of: a bias of shape ", bias.sizes(), " for a weight of shape ", weight.sizes());
  std::shared_ptr<Linear> part(new Linear());
  part->weight_ = std::move(weight);
  part->bias_ = std::move(bias);
  part->in_ = part->weight_.size(1);
  part->out_ = rows;
  part->begin_ = begin;
  part->rows_ = rows;
  return part;
}

at::Tensor Linear::weight() const { return is_part() ? weight_.narrow(0, begin_, rows_) : weight_; }

at::Tensor Linear::bias() const {
  if (!bias_.defined() || !is_part()) return bias_;
  return bias_.narrow(0, begin_, rows_);
}

at::Tensor Linear::forward(const at::Tensor& x) { return adapt(at::linear(x, weight(), bias()), x); }

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel, std::int64_t stride,
               std::int64_t padding, bool bias)
    : in_(in_channels), out_(out_channels), kernel_(kernel), stride_(stride), padding_(padding) {
  TRAINER_CHECK(in_channels > 0 && out_channels > 0 && kernel > 0 && stride > 0 && padding >= 0, "Conv2d: in ",
                in_channels, ", out ", out_channels, ", kernel ", kernel, ", stride ", stride, ", padding ", padding);
  weight_ = register_parameter("weight",
                               at::empty({out_channels, in_channels, kernel, kernel}, detail::DeferInit::options()));
  if (bias) bias_ = register_parameter("bias", at::empty({out_channels}, detail::DeferInit::options()));
  at::NoGradGuard no_grad;
  init_like_torch_nn(weight_, bias_);
}

at::Tensor Conv2d::forward(const at::Tensor& x) {
  return adapt(at::conv2d(x, weight_, bias_, {stride_, stride_}, {padding_, padding_}), x);
}

}  // namespace trainer
