#pragma once
// Private: the LayerNorm of the transformer models (vit, bert).
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>

#include "model/deferred_init.h"

namespace trainer::detail {

/// LayerNorm that computes in its parameters' dtype.
/// NOTE: under CPU autocast (LibTorch 1.13) at::layer_norm of a bfloat16 input with float32
/// weights fails ("expected scalar type BFloat16 but found Float"), and CUDA autocast runs
/// layer_norm in float32 anyway: so the input is cast to the weights' dtype, here and on CUDA.
class LayerNorm final : public torch::nn::Module {
 public:
  LayerNorm(std::int64_t dim, double eps) : dim_(dim), eps_(eps) {
    weight_ = register_parameter("weight", at::ones({dim}, DeferInit::options()));
    bias_ = register_parameter("bias", at::zeros({dim}, DeferInit::options()));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor in = x.scalar_type() == weight_.scalar_type() ? x : x.to(weight_.scalar_type());
    return at::layer_norm(in, {dim_}, weight_, bias_, eps_);
  }

 private:
  std::int64_t dim_;
  double eps_;
  at::Tensor weight_, bias_;
};

}  // namespace trainer::detail
