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
//
// The same optimizer keeps the moments in bf16 instead (moment bits 16: the memory ladder's
// optimizer_bf16 rung), two bytes per value, or in fp32 (moment bits 32, AdamW's own operations
// bit for bit), updated the same way a chunk at a time. with_moment_bits() converts an AdamW's
// state (LibTorch's, or this one's) between 32, 16 and 8 bits, one parameter at a time.
//
// Offloaded (the memory ladder's offload rung, with_offload()), the moments live in host memory
// (pinned when the parameter is on a GPU) and the step streams them: each chunk is copied to
// the parameter's device, updated there, and copied back, so the device holds a chunk's moments
// at a time instead of all of them. The results are those of the moments kept on the device.
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
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
/// dynamic_quant_map as an fp32 tensor on the CPU.
at::Tensor quant_map_tensor(bool is_signed);

struct TRAINER_API AdamW8bitParamState : public torch::optim::OptimizerCloneableParamState<AdamW8bitParamState> {
  TORCH_ARG(std::int64_t, step) = 0;
  /// fp32 and shaped like the parameter for small tensors; otherwise flat, in the parameter's
  /// logical order: uint8 codes (8 bits) or bf16 values (16 bits).
  TORCH_ARG(at::Tensor, exp_avg);
  TORCH_ARG(at::Tensor, exp_avg_sq);
  /// Per block (quantized moments only; undefined otherwise).
  TORCH_ARG(at::Tensor, exp_avg_absmax) = {};
  TORCH_ARG(at::Tensor, exp_avg_sq_absmax) = {};

 public:
  bool quantized() const { return exp_avg_absmax().defined(); }
  /// bf16 moments (moment bits 16, tensors of kMin8bitNumel values or more).
  bool bf16() const { return exp_avg().defined() && exp_avg().scalar_type() == at::kBFloat16; }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Exported, as the functions above, for the tests.
class TRAINER_API AdamW8bit : public torch::optim::Optimizer {
 public:
  /// The options are AdamW's (amsgrad is refused). `moment_bits`: 8 (block-wise codes) or 16
  /// (bf16) for tensors of kMin8bitNumel values or more, or 32 (fp32 for every tensor).
  AdamW8bit(std::vector<at::Tensor> params, const torch::optim::AdamWOptions& defaults, int moment_bits = 8);
  AdamW8bit(std::vector<torch::optim::OptimizerParamGroup> groups, const torch::optim::AdamWOptions& defaults,
            int moment_bits);

  int moment_bits() const { return bits_; }
  /// The bits of the states made from now on (those there stay in theirs).
  void set_moment_bits(int bits) { bits_ = bits; }
  /// load() then takes every form a step reads (fp32, bf16, 8-bit) for any parameter, not only
  /// its bits' form: for a checkpoint of a run whose moments' bits changed part-way.
  void accept_mixed_forms(bool on) { mixed_ = on; }
  /// Whether the states made from now on (and those load() reads) live in host memory, streamed
  /// a chunk at a time through each step. A state whose moments are on another device than its
  /// parameter is streamed either way (a conversion that stopped part-way leaves some).
  bool offload() const { return offload_; }
  void set_offload(bool on) { offload_ = on; }

  at::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The state of `param`, created zero (step 0) when it has none: what its first step would create.
  AdamW8bitParamState& state_of(const at::Tensor& param);

  /// Values processed together in a step: a multiple of kQuantBlock (the step's temporaries are
  /// a few fp32 tensors of this many values).
  static constexpr std::int64_t kChunk = 64 * 1024;
  /// The most a step allocates at once for a parameter of `numel` values (the dequantized chunk,
  /// its update and the quantization's intermediates: under 64 bytes per value of a chunk,
  /// tests/core/adamw8bit_test.cpp measures it), for the step's reserve.
  static std::int64_t step_temporary_bytes(std::int64_t numel) { return 64 * std::min(numel, kChunk); }

 private:
  void update(const at::Tensor& param, const at::Tensor& grad, AdamW8bitParamState& st,
              const torch::optim::AdamWOptions& o);
  /// The maps on `device` (kept there after the first use).
  const at::Tensor& map_on(bool is_signed, const c10::Device& device);
  int bits_ = 8;
  bool mixed_ = false;
  bool offload_ = false;
  at::Tensor signed_map_, unsigned_map_;
  at::Tensor signed_on_device_, unsigned_on_device_;
};

/// The bits `opt` keeps AdamW's moments in: 32 for LibTorch's AdamW without amsgrad, 32, 16 or
/// 8 for an AdamW8bit; 0 for any other optimizer (its state cannot change precision).
TRAINER_API int moment_bits_of(const torch::optim::Optimizer& opt);
/// Whether `opt` keeps its moments in host memory (an offloaded AdamW8bit).
TRAINER_API bool offloaded(const torch::optim::Optimizer& opt);
/// Host memory for a copy of `t` (in `dtype`; t's own when unset), state of a parameter on
/// `param_device`: pinned when that is a GPU (so that the copies overlap), plain on the CPU.
at::Tensor host_copy(const at::Tensor& t, const c10::Device& param_device,
                     std::optional<at::ScalarType> dtype = std::nullopt);

/// What with_moment_bits() made.
struct MomentConversion {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  int bits = 0;                ///< the moment bits it reports (moment_bits_of(*optimizer))
  std::int64_t converted = 0;  ///< parameters whose state was converted
  std::int64_t total = 0;      ///< parameters with state
  std::string error;           ///< why the conversion stopped early ("" when it did not)
  bool offload = false;        ///< the moments are in host memory (offloaded(*optimizer))
};

/// An optimizer over the same parameter groups and options as `opt` (moment_bits_of(opt) > 0)
/// with the moments in `bits`: LibTorch's AdamW for 32, an AdamW8bit for 16 and 8. The state is
/// converted one parameter at a time and dropped from `opt` as it goes (at most one
/// parameter's moments exist twice); each parameter's step count is kept. Moments in fewer
/// bits than they were lose precision, and converting back does not restore it. When a
/// conversion fails (out of memory), the parameters not converted keep their state as it was
/// in an AdamW8bit (which steps every form), `error` says why, and `bits` is the bits asked for
/// when fewer than before (the savings are partly there), else the bits before. `opt` is left
/// without state either way.
/// An offloaded optimizer keeps its moments in host memory, converted there.
TRAINER_API MomentConversion with_moment_bits(torch::optim::Optimizer& opt, int bits);

/// An optimizer over the same parameter groups, options and moment bits as `opt`
/// (moment_bits_of(opt) > 0) with its moments in host memory (`on`: an offloaded AdamW8bit) or
/// on their parameters' devices (LibTorch's AdamW for 32 bits, an AdamW8bit for 16 and 8). Exact:
/// the moments are moved, not converted. One parameter at a time, each dropped from `opt` as it
/// goes. When a move fails (out of memory), the rest stay where they were in an AdamW8bit (its
/// step streams moments that are not on their parameter's device), `error` says why, and
/// `offload` stays true when any moment is still in host memory. `bits` is moment_bits_of(opt).
TRAINER_API MomentConversion with_offload(torch::optim::Optimizer& opt, bool on);

}  // namespace trainer::detail
