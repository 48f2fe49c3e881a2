#include "optim/adamw8bit.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "trainer/error.h"
#include "util/torch_compat.h"

namespace trainer::detail {

std::vector<float> dynamic_quant_map(bool is_signed) {
  // bitsandbytes.functional.create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): the
  // midpoints of linspace(0.1, 1, items), times 10^e. Computed in double and rounded to float
  // once, not with torch's float32 linspace as bitsandbytes does: that one's last bits depend on
  // the LibTorch version (Debian's 1.13 and PyPI's 2.11 differ in 42 of the signed map's 256
  // entries and 43 of the unsigned map's, by up to two units in the last place), and the map must
  // be the same wherever a checkpoint's codes are read.
  constexpr int kExponentBits = 7, kNonSignBits = 7;
  constexpr double kPowers[kExponentBits] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};  // Python's 10 ** e
  std::vector<float> data;
  for (int i = 0; i < kExponentBits; ++i) {
    const int items =
        is_signed ? (1 << (i + kNonSignBits - kExponentBits)) + 1 : (1 << (i + kNonSignBits - kExponentBits + 1)) + 1;
    const auto bound = [items](int k) { return 0.1 + 0.9 * k / (items - 1); };
    for (int k = 0; k + 1 < items; ++k) {
      const double mean = (bound(k) + bound(k + 1)) / 2.0;
      data.push_back(static_cast<float>(mean * kPowers[i]));
      if (is_signed) data.push_back(static_cast<float>(-mean * kPowers[i]));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  data.resize(256, 0.0f);
  std::sort(data.begin(), data.end());
  return data;
}

void quantize_blockwise(const at::Tensor& x, const at::Tensor& map, at::Tensor& codes, at::Tensor& absmax) {
  const at::Tensor flat = x.reshape({-1});
  const std::int64_t n = flat.numel(), blocks = (n + kQuantBlock - 1) / kQuantBlock;
  at::Tensor padded = flat;
  if (blocks * kQuantBlock != n) padded = at::constant_pad_nd(flat, {0, blocks * kQuantBlock - n}, 0);
  const at::Tensor rows = padded.view({blocks, kQuantBlock});
  absmax = std::get<0>(rows.abs().max(1));
  // Divided by the very scale stored (a block of zeros by 1: its codes stand for 0.0).
  const at::Tensor divisor = at::where(absmax > 0, absmax, at::ones_like(absmax));
  const at::Tensor normalized = (rows / divisor.unsqueeze(1)).reshape({-1}).narrow(0, 0, n);
  // The nearest entry of the sorted map: the first one not below, or the one before it.
  const at::Tensor above = at::searchsorted(map, normalized, /*out_int32=*/true).clamp(0, 255);
  const at::Tensor below = (above - 1).clamp_min(0);
  const at::Tensor nearer_below =
      (normalized - map.index_select(0, below)).abs() <= (map.index_select(0, above) - normalized).abs();
  codes = at::where(nearer_below, below, above).to(at::kByte);
}

at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax, const at::Tensor& map) {
  const std::int64_t n = codes.numel();
  const at::Tensor values = map.index_select(0, codes.to(at::kLong));
  const at::Tensor scale = absmax.repeat_interleave(kQuantBlock).narrow(0, 0, n);
  return values * scale;
}

at::Tensor quant_map_tensor(bool is_signed) {
  const std::vector<float> m = dynamic_quant_map(is_signed);
  return at::tensor(at::ArrayRef<float>(m), at::kFloat);
}

void AdamW8bitParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(std::int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_absmax);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq_absmax);
}

void AdamW8bitParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_absmax);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq_absmax);
}

AdamW8bit::AdamW8bit(std::vector<at::Tensor> params, const torch::optim::AdamWOptions& defaults, int moment_bits)
    : AdamW8bit(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
                defaults, moment_bits) {}

AdamW8bit::AdamW8bit(std::vector<torch::optim::OptimizerParamGroup> groups, const torch::optim::AdamWOptions& defaults,
                     int moment_bits)
    : torch::optim::Optimizer(std::move(groups), std::make_unique<torch::optim::AdamWOptions>(defaults)),
      bits_(moment_bits),
      signed_map_(quant_map_tensor(true)),
      unsigned_map_(quant_map_tensor(false)) {
  TRAINER_CHECK(moment_bits == 8 || moment_bits == 16 || moment_bits == 32,
                "AdamW8bit keeps its moments in 8, 16 or 32 bits, not ", moment_bits);
  TRAINER_CHECK(!defaults.amsgrad(), "adamw8bit has no amsgrad");
}

AdamW8bitParamState& AdamW8bit::state_of(const at::Tensor& p) {
  const auto key = compat::optimizer_state_key(*this, p);
  auto it = state_.find(key);
  if (it == state_.end()) {
    auto st = std::make_unique<AdamW8bitParamState>();
    // Offloaded: in host memory, pinned for a parameter on a GPU (the step streams it).
    const at::TensorOptions where =
        offload_ ? p.options().device(at::kCPU).pinned_memory(p.device().is_cuda()) : p.options();
    const at::TensorOptions fp32 = where.dtype(at::kFloat);
    if (p.numel() >= kMin8bitNumel && bits_ == 16) {
      st->exp_avg(at::zeros({p.numel()}, where.dtype(at::kBFloat16)));
      st->exp_avg_sq(at::zeros({p.numel()}, where.dtype(at::kBFloat16)));
    } else if (p.numel() >= kMin8bitNumel && bits_ == 8) {
      const std::int64_t blocks = (p.numel() + kQuantBlock - 1) / kQuantBlock;
      // Zero moments: every code stands for 0 (the maps' 0 entry), every scale 0.
      const at::Tensor zero_code_signed = at::searchsorted(signed_map_, at::zeros({1}, at::kFloat)).to(at::kByte);
      const at::Tensor zero_code_unsigned = at::searchsorted(unsigned_map_, at::zeros({1}, at::kFloat)).to(at::kByte);
      st->exp_avg(at::full({p.numel()}, zero_code_signed.item<std::uint8_t>(), where.dtype(at::kByte)));
      st->exp_avg_sq(at::full({p.numel()}, zero_code_unsigned.item<std::uint8_t>(), where.dtype(at::kByte)));
      st->exp_avg_absmax(at::zeros({blocks}, fp32));
      st->exp_avg_sq_absmax(at::zeros({blocks}, fp32));
    } else {
      st->exp_avg(at::zeros(p.sizes(), fp32));
      st->exp_avg_sq(at::zeros(p.sizes(), fp32));
    }
    it = state_.emplace(key, std::move(st)).first;
  }
  return static_cast<AdamW8bitParamState&>(*it->second);
}

const at::Tensor& AdamW8bit::map_on(bool is_signed, const c10::Device& device) {
  const at::Tensor& host = is_signed ? signed_map_ : unsigned_map_;
  if (device.is_cpu()) return host;
  at::Tensor& cached = is_signed ? signed_on_device_ : unsigned_on_device_;
  if (!cached.defined() || cached.device() != device) cached = host.to(device);
  return cached;
}

void AdamW8bit::update(const at::Tensor& param, const at::Tensor& grad, AdamW8bitParamState& st,
                       const torch::optim::AdamWOptions& o) {
  const double lr = o.lr(), b1 = std::get<0>(o.betas()), b2 = std::get<1>(o.betas());
  st.step(st.step() + 1);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(st.step()));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(st.step()));
  const double step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
  if (o.weight_decay() != 0) param.mul_(1.0 - lr * o.weight_decay());
  // fp32 parameters take AdamW's own operations (bit for bit for fp32 moments); others get the
  // update computed in fp32 (eps = 1e-8 is 0 in fp16) and added in their precision.
  const bool fp32 = param.scalar_type() == at::kFloat;
  auto apply = [&](const at::Tensor& target, const at::Tensor& m, const at::Tensor& denom) {
    if (fp32) {
      target.addcdiv_(m, denom, -step_size);
    } else {
      target.add_((m / denom).mul_(-step_size).to(target.scalar_type()));
    }
  };
  // Moments in host memory (offloaded) are streamed: each piece the step reads is copied to the
  // parameter's device (`fetch`), updated there and copied back (`put`). For a parameter on a
  // GPU the copies are queued on its stream in order, and step() waits for them before it
  // returns; for one on the CPU they are plain copies. Otherwise the step updates the stored
  // moments in place (fetch returns them, put does nothing).
  const bool stream = offload_ || st.exp_avg().device() != param.device();
  const c10::Device device = param.device();
  const bool async = stream && device.is_cuda();
  auto fetch = [&](const at::Tensor& stored) {
    return stream ? stored.to(device, stored.scalar_type(), /*non_blocking=*/async, /*copy=*/true) : stored;
  };
  auto put = [&](const at::Tensor& stored, const at::Tensor& updated) {
    if (stream) stored.copy_(updated.to(stored.scalar_type()), /*non_blocking=*/async);
  };
  const bool fp32_moments = !st.quantized() && !st.bf16();
  if (fp32_moments && param.numel() <= kChunk) {
    const at::Tensor g = grad.to(at::kFloat);
    const at::Tensor m = fetch(st.exp_avg()), v = fetch(st.exp_avg_sq());
    m.mul_(b1).add_(g, 1.0 - b1);
    v.mul_(b2).addcmul_(g, g, 1.0 - b2);
    const at::Tensor denom = (v.sqrt() / bc2_sqrt).add_(o.eps());
    apply(param, m, denom);
    put(st.exp_avg(), m);
    put(st.exp_avg_sq(), v);
    return;
  }
  // The moments and the update in the parameter's logical order, a chunk of blocks at a time.
  const bool contiguous = param.is_contiguous();
  at::Tensor p = contiguous ? param.view({-1}) : param.contiguous().view({-1});
  const at::Tensor g = grad.contiguous().view({-1});
  const std::int64_t n = p.numel();
  if (fp32_moments) {
    // fp32 moments of a large tensor (a run whose moments' bits changed part-way holds some):
    // AdamW's operations a chunk at a time, so the step's temporaries stay a chunk's.
    const bool own_layout = st.exp_avg().is_contiguous() && st.exp_avg_sq().is_contiguous();
    at::Tensor m_all = own_layout ? st.exp_avg().view({-1}) : st.exp_avg().contiguous().view({-1});
    at::Tensor v_all = own_layout ? st.exp_avg_sq().view({-1}) : st.exp_avg_sq().contiguous().view({-1});
    for (std::int64_t begin = 0; begin < n; begin += kChunk) {
      const std::int64_t len = std::min(kChunk, n - begin);
      const at::Tensor m_store = m_all.narrow(0, begin, len), v_store = v_all.narrow(0, begin, len);
      const at::Tensor m = fetch(m_store), v = fetch(v_store);
      const at::Tensor gc = g.narrow(0, begin, len).to(at::kFloat);
      m.mul_(b1).add_(gc, 1.0 - b1);
      v.mul_(b2).addcmul_(gc, gc, 1.0 - b2);
      const at::Tensor denom = (v.sqrt() / bc2_sqrt).add_(o.eps());
      apply(p.narrow(0, begin, len), m, denom);
      put(m_store, m);
      put(v_store, v);
    }
    if (!own_layout) {
      st.exp_avg().copy_(m_all.view(param.sizes()));
      st.exp_avg_sq().copy_(v_all.view(param.sizes()));
    }
    if (!contiguous) param.copy_(p.view(param.sizes()));
    return;
  }
  if (st.bf16()) {
    // bf16 moments: each chunk read into fp32, updated as AdamW, rounded back to bf16 (to nearest).
    for (std::int64_t begin = 0; begin < n; begin += kChunk) {
      const std::int64_t len = std::min(kChunk, n - begin);
      at::Tensor m_store = st.exp_avg().narrow(0, begin, len), v_store = st.exp_avg_sq().narrow(0, begin, len);
      const at::Tensor gc = g.narrow(0, begin, len).to(at::kFloat);
      at::Tensor m = fetch(m_store).to(at::kFloat).mul_(b1).add_(gc, 1.0 - b1);
      at::Tensor v = fetch(v_store).to(at::kFloat).mul_(b2).addcmul_(gc, gc, 1.0 - b2);
      const at::Tensor denom = (v.sqrt() / bc2_sqrt).add_(o.eps());
      apply(p.narrow(0, begin, len), m, denom);
      if (stream) {
        put(m_store, m);
        put(v_store, v);
      } else {
        m_store.copy_(m);
        v_store.copy_(v);
      }
    }
    if (!contiguous) param.copy_(p.view(param.sizes()));
    return;
  }
  const at::Tensor& smap = map_on(true, p.device());
  const at::Tensor& umap = map_on(false, p.device());
  for (std::int64_t begin = 0; begin < n; begin += kChunk) {
    const std::int64_t len = std::min(kChunk, n - begin);
    const std::int64_t first_block = begin / kQuantBlock, blocks = (len + kQuantBlock - 1) / kQuantBlock;
    at::Tensor m_codes = st.exp_avg().narrow(0, begin, len), v_codes = st.exp_avg_sq().narrow(0, begin, len);
    at::Tensor m_scale = st.exp_avg_absmax().narrow(0, first_block, blocks);
    at::Tensor v_scale = st.exp_avg_sq_absmax().narrow(0, first_block, blocks);
    const at::Tensor gc = g.narrow(0, begin, len).to(at::kFloat);
    at::Tensor m = dequantize_blockwise(fetch(m_codes), fetch(m_scale), smap).mul_(b1).add_(gc, 1.0 - b1);
    at::Tensor v = dequantize_blockwise(fetch(v_codes), fetch(v_scale), umap).mul_(b2).addcmul_(gc, gc, 1.0 - b2);
    const at::Tensor denom = (v.sqrt() / bc2_sqrt).add_(o.eps());
    apply(p.narrow(0, begin, len), m, denom);
    // A non-finite gradient spoils its own element (as in AdamW), not its block's scale.
    m.nan_to_num_(0.0, 0.0, 0.0);
    v.nan_to_num_(0.0, 0.0, 0.0);
    at::Tensor codes, absmax;
    quantize_blockwise(m, smap, codes, absmax);
    m_codes.copy_(codes, /*non_blocking=*/async);
    m_scale.copy_(absmax, /*non_blocking=*/async);
    quantize_blockwise(v, umap, codes, absmax);
    v_codes.copy_(codes, /*non_blocking=*/async);
    v_scale.copy_(absmax, /*non_blocking=*/async);
  }
  if (!contiguous) param.copy_(p.view(param.sizes()));
}

at::Tensor AdamW8bit::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  std::vector<c10::Device> streamed;  // the GPUs whose streams hold copies into host memory
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TRAINER_CHECK(!o.amsgrad(), "adamw8bit has no amsgrad (a parameter group asks for it)");
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TRAINER_CHECK(!p.grad().is_sparse(), "adamw8bit does not support sparse gradients");
      AdamW8bitParamState& st = state_of(p);
      const bool queued = p.device().is_cuda() && (offload_ || st.exp_avg().device() != p.device());
      if (queued && std::find(streamed.begin(), streamed.end(), p.device()) == streamed.end()) {
        streamed.push_back(p.device());
      }
      update(p, p.grad(), st, o);
    }
  }
  // The moments copied back to host memory are there when the step returns (a checkpoint or a
  // conversion reads them on the host).
  for (const c10::Device& d : streamed) torch::cuda::synchronize(d.index());
  return loss;
}

void AdamW8bit::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<AdamW8bitParamState, torch::optim::AdamWOptions>(archive, *this);
}

void AdamW8bit::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<AdamW8bitParamState, torch::optim::AdamWOptions>(archive, *this);
  // A checkpoint is a file from outside: each state must fit its parameter before a step reads it.
  std::size_t index = 0;
  for (auto& group : param_groups_) {
    for (auto& p : group.params()) {
      const auto it = state_.find(compat::optimizer_state_key(*this, p));
      ++index;
      if (it == state_.end()) continue;
      const auto* st = dynamic_cast<const AdamW8bitParamState*>(it->second.get());
      const std::int64_t n = p.numel(), blocks = (n + kQuantBlock - 1) / kQuantBlock;
      auto flat = [](const at::Tensor& t, at::ScalarType type, std::int64_t numel) {
        return t.defined() && t.scalar_type() == type && t.dim() == 1 && t.numel() == numel && t.is_contiguous();
      };
      auto shaped = [&p](const at::Tensor& t) {
        return t.defined() && t.scalar_type() == at::kFloat && t.sizes() == p.sizes();
      };
      // The form of its moment bits: fp32 shaped like the parameter for small tensors, else bf16
      // or 8-bit codes, flat. A run whose moments' bits changed part-way holds a mix of the
      // three (its checkpoint says so: accept_mixed_forms).
      const bool large = n >= kMin8bitNumel;
      if (st == nullptr) {
        state_.clear();
        throw UsageError(fmt::format("adamw8bit: the saved state of parameter {} is not AdamW's", index - 1));
      }
      const bool fp32 = shaped(st->exp_avg()) && shaped(st->exp_avg_sq()) && !st->exp_avg_absmax().defined() &&
                        !st->exp_avg_sq_absmax().defined() && (!large || mixed_ || bits_ == 32);
      const bool bf16 = large && (bits_ == 16 || mixed_) && flat(st->exp_avg(), at::kBFloat16, n) &&
                        flat(st->exp_avg_sq(), at::kBFloat16, n) && !st->exp_avg_absmax().defined() &&
                        !st->exp_avg_sq_absmax().defined();
      const bool codes = large && (bits_ == 8 || mixed_) && flat(st->exp_avg(), at::kByte, n) &&
                         flat(st->exp_avg_sq(), at::kByte, n) && flat(st->exp_avg_absmax(), at::kFloat, blocks) &&
                         flat(st->exp_avg_sq_absmax(), at::kFloat, blocks);
      const bool ok = st->step() >= 0 && (fp32 || bf16 || codes);
      if (!ok) {
        state_.clear();  // none of the checkpoint's state is kept: the optimizer starts fresh or not at all
        throw UsageError(fmt::format(
            "adamw8bit: the saved state of parameter {} ({} values) does not fit it: expected {} (was it saved "
            "by another optimizer or model?)",
            index - 1, n,
            !large        ? fmt::format("fp32 moments shaped like it")
            : bits_ == 16 ? fmt::format("bf16 moments of {} values", n)
                          : fmt::format("uint8 codes of {} values and fp32 scales of {} blocks", n, blocks)));
      }
      // On the parameter's device, as the step reads them, or offloaded in host memory (pinned
      // for a parameter on a GPU).
      auto* own = static_cast<AdamW8bitParamState*>(it->second.get());
      auto place = [&](const at::Tensor& t) {
        if (!offload_) return t.device() == p.device() ? t : t.to(p.device());
        return p.device().is_cuda() || !t.device().is_cpu() ? host_copy(t, p.device()) : t;
      };
      own->exp_avg(place(own->exp_avg()));
      own->exp_avg_sq(place(own->exp_avg_sq()));
      if (own->quantized()) {
        own->exp_avg_absmax(place(own->exp_avg_absmax()));
        own->exp_avg_sq_absmax(place(own->exp_avg_sq_absmax()));
      }
    }
  }
}

}  // namespace trainer::detail
