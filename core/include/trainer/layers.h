#pragma once
// Layers the built-in models are made of where a plugin may attach an adapter (LoRA): a
// linear layer and a 2-D convolution with torch.nn's parameter names and initialisation.
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>

#include "trainer/export.h"

namespace trainer {

/// A term a plugin adds to a layer's output: layer(x) = base(x) + adapter(x), x the layer's
/// own input.
class TRAINER_API Adapter : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  /// The term for the layer's input `x`, in the shape of the layer's output.
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  /// The change of the layer's weight that computes the same term (in the weight's shape and
  /// dtype): merging adds it to the weight.
  virtual at::Tensor delta_weight() const = 0;
};

/// A layer whose output an Adapter may extend, and whose weight may absorb it (merge) and give
/// it back (unmerge). Not thread-safe; merge/unmerge change the weight in place.
class TRAINER_API AdaptableLayer : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  /// The weight a merge changes: the layer's own, or its rows of a fused projection.
  virtual at::Tensor weight() const = 0;

  /// Attaches `adapter` as the child module `name`: its parameters become the model's, named
  /// <layer>.<name>.*. A layer takes one adapter; a second throws.
  void set_adapter(const std::string& name, std::shared_ptr<Adapter> adapter);
  const std::shared_ptr<Adapter>& adapter() const { return adapter_; }
  /// weight += the adapter's delta_weight(); from then on the forward leaves the adapter out
  /// (same output, one matmul less). No-op without an adapter or when merged already.
  void merge();
  /// weight -= the adapter's delta_weight() (undoes merge() up to rounding in the weight's
  /// dtype); the forward adds the adapter again. No-op unless merged.
  void unmerge();
  bool merged() const { return merged_; }

  /// y + adapter(x), or y alone without an adapter or when merged. Layers call it on their
  /// base output; a fused projection calls it once per part.
  at::Tensor adapt(const at::Tensor& y, const at::Tensor& x);

 private:
  std::shared_ptr<Adapter> adapter_;
  bool merged_ = false;
};

/// y = x W^T + b (+ the adapter's term). Parameters "weight" [out, in] and "bias" [out], as
/// torch.nn.Linear, initialised as torch::nn::Linear does (the same random draws in the same
/// order). Or a *part* of a fused projection (part_of), which owns no parameter.
class TRAINER_API Linear : public AdaptableLayer {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true);
  /// Rows [begin, begin + rows) of a fused projection whose weight [*, in] and bias [*] a
  /// parent module owns and registers (the q, k and v of an attention's in_proj_weight). The
  /// tensors are sliced at each use, so moving or converting the parent is seen here.
  static std::shared_ptr<Linear> part_of(at::Tensor weight, at::Tensor bias, std::int64_t begin, std::int64_t rows);

  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight() const override;
  at::Tensor bias() const;  ///< undefined without a bias
  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  bool is_part() const { return rows_ >= 0; }

 private:
  Linear() = default;
  at::Tensor weight_, bias_;
  std::int64_t in_ = 0, out_ = 0;
  std::int64_t begin_ = 0, rows_ = -1;  ///< a part: rows of weight_/bias_ (-1: a whole layer)
};

/// 2-D convolution with a square kernel (no dilation, one group), as torch.nn.Conv2d:
/// parameters "weight" [out, in, k, k] and "bias" [out] (when `bias`), initialised as
/// torch::nn::Conv2d does.
class TRAINER_API Conv2d : public AdaptableLayer {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel, std::int64_t stride = 1,
         std::int64_t padding = 0, bool bias = true);

  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight() const override { return weight_; }
  at::Tensor bias() const { return bias_; }  ///< undefined without a bias
  std::int64_t in_channels() const { return in_; }
  std::int64_t out_channels() const { return out_; }
  std::int64_t kernel() const { return kernel_; }
  std::int64_t stride() const { return stride_; }
  std::int64_t padding() const { return padding_; }

 private:
  at::Tensor weight_, bias_;
  std::int64_t in_, out_, kernel_, stride_, padding_;
};

}  // namespace trainer
