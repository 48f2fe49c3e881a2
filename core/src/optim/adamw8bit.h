#pragma once
// AdamW with its two moments kept in 8 bits, block-wise (the method of bitsandbytes' and
// torchao's AdamW8bit): each block of 256 values of a moment is stored as one byte per value,
// the index of the nearest entry of a 256-entry dynamic quantization map scaled by the block's
// largest magnitude (one fp32 per block). The first moment uses the signed map, the second the
// unsigned one. A step dequantizes a chunk of blocks to fp32, updates it and the parameters
// exactly as AdamW does, and quantizes it back, so the step's temporaries are a chunk's, not a
// parameter's. Tensors of fewer than 4,096 values (biases, norms) keep fp32 moments, as
// bitsandbytes does. Parameters stay in their own precision; updates are deterministic (no
// stochastic rounding). State: about 1.016 bytes per value and moment instead of 4.
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <cstdint>
#include <vector>

#include "trainer/export.h"

namespace trainer::detail {

/// Values per quantization block, and tensors smaller than this many values keep fp32 moments.
inline constexpr std::int64_t kQuantBlock = 256;
inline constexpr std::int64_t kMin8bitNumel = 4096;

/// The 256 values of bitsandbytes' dynamic quantization map (create_dynamic_map with 7
/// exponent bits), sorted: signed spans [-0.99, 1], unsigned [0, 1].
TRAINER_API std::vector<float> dynamic_quant_map(bool is_signed);

/// Block-wise 8-bit codes of `x` (any shape, fp32): `codes` gets one uint8 per value (flat),
/// `absmax` one fp32 per block of kQuantBlock values.
TRAINER_API void quantize_blockwise(const at::Tensor& x, const at::Tensor& map, at::Tensor& codes, at::Tensor& absmax);
/// The fp32 values `codes` and `absmax` stand for (flat, codes.numel() values).
TRAINER_API at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax, const at::Tensor& map);

struct TRAINER_API AdamW8bitParamState : public torch::optim::OptimizerCloneableParamState<AdamW8bitParamState> {
  TORCH_ARG(std::int64_t, step) = 0;
  /// fp32 and shaped like the parameter for small tensors; uint8 codes (flat) otherwise.
  TORCH_ARG(at::Tensor, exp_avg);
  TORCH_ARG(at::Tensor, exp_avg_sq);
  /// Per block (quantized moments only; undefined otherwise).
  TORCH_ARG(at::Tensor, exp_avg_absmax) = {};
  TORCH_ARG(at::Tensor, exp_avg_sq_absmax) = {};

 public:
  bool quantized() const { return exp_avg_absmax().defined(); }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Exported, as the functions above, for the tests.
class TRAINER_API AdamW8bit : public torch::optim::Optimizer {
 public:
  /// The options are AdamW's (amsgrad is refused).
  AdamW8bit(std::vector<at::Tensor> params, const torch::optim::AdamWOptions& defaults);

  at::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The state of `param`, created zero (step 0) when it has none: what its first step would create.
  AdamW8bitParamState& state_of(const at::Tensor& param);

  /// Values processed together in a step: a multiple of kQuantBlock (the step's temporaries are
  /// a few fp32 tensors of this many values).
  static constexpr std::int64_t kChunk = 64 * 1024;

 private:
  void update(const at::Tensor& param, const at::Tensor& grad, AdamW8bitParamState& st,
              const torch::optim::AdamWOptions& o);
  /// The maps on `device` (kept there after the first use).
  const at::Tensor& map_on(bool is_signed, const c10::Device& device);
  at::Tensor signed_map_, unsigned_map_;
  at::Tensor signed_on_device_, unsigned_on_device_;
};

}  // namespace trainer::detail
