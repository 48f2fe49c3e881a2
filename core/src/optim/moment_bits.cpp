// Moving AdamW's state between 32, 16 and 8 bits, and between the device and host memory
// (declared in adamw8bit.h): moment_bits_of, offloaded, with_moment_bits, with_offload. One
// parameter at a time, a chunk at a time, each step count kept.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include "optim/adamw8bit.h"
#include "trainer/error.h"
#include "util/torch_compat.h"

namespace trainer::detail {

int moment_bits_of(const torch::optim::Optimizer& opt) {
  if (const auto* eight = dynamic_cast<const AdamW8bit*>(&opt)) return eight->moment_bits();
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamW*>(&opt)) {
    for (const auto& group : adamw->param_groups()) {
      if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return 0;
    }
    return 32;
  }
  return 0;
}

bool offloaded(const torch::optim::Optimizer& opt) {
  const auto* eight = dynamic_cast<const AdamW8bit*>(&opt);
  return eight != nullptr && eight->offload();
}

at::Tensor host_copy(const at::Tensor& t, const c10::Device& param_device, std::optional<at::ScalarType> dtype) {
  at::Tensor out = at::empty(
      t.sizes(),
      t.options().dtype(dtype.value_or(t.scalar_type())).device(at::kCPU).pinned_memory(param_device.is_cuda()));
  out.copy_(t);
  return out;
}

namespace {

/// A parameter's moments as they are stored, whichever optimizer holds them.
struct StoredMoments {
  std::int64_t step = 0;
  at::Tensor m, v, m_scale, v_scale;  ///< scales: 8-bit codes only
};

StoredMoments stored(const torch::optim::OptimizerParamState& base) {
  if (const auto* own = dynamic_cast<const AdamW8bitParamState*>(&base)) {
    return {own->step(), own->exp_avg(), own->exp_avg_sq(), own->exp_avg_absmax(), own->exp_avg_sq_absmax()};
  }
  const auto& st = static_cast<const torch::optim::AdamWParamState&>(base);
  return {st.step(), st.exp_avg(), st.exp_avg_sq(), {}, {}};
}

/// The form moments of `numel` values take in `bits`: fp32 (shaped like the parameter) for 32
/// bits and for tensors under kMin8bitNumel, else bf16 or 8-bit codes (flat). `Native`: none of
/// these, LibTorch's AdamW's moments in the dtype of a parameter that is not fp32 (bf16, fp16,
/// fp64), shaped like it: always converted.
enum class Form { Fp32, Bf16, Codes, Native };
Form form_for(int bits, std::int64_t numel) {
  if (bits == 32 || numel < kMin8bitNumel) return Form::Fp32;
  return bits == 16 ? Form::Bf16 : Form::Codes;
}
Form form_of(const StoredMoments& s) {
  if (s.m_scale.defined()) return Form::Codes;
  if (s.m.scalar_type() == at::kBFloat16 && s.m.dim() == 1) return Form::Bf16;
  return s.m.scalar_type() == at::kFloat ? Form::Fp32 : Form::Native;
}

/// `values` values of a stored moment from `begin`, in fp32 (the parameter's logical order).
at::Tensor read_chunk(const at::Tensor& flat, const at::Tensor& scale, const at::Tensor& map, std::int64_t begin,
                      std::int64_t len) {
  if (!scale.defined()) return flat.narrow(0, begin, len).to(at::kFloat);
  return dequantize_blockwise(flat.narrow(0, begin, len),
                              scale.narrow(0, begin / kQuantBlock, (len + kQuantBlock - 1) / kQuantBlock), map);
}

/// Converts one moment (`flat`: its stored values flat in logical order) into `to`, a chunk at
/// a time, where it is (`where`: the parameter's device, or host memory when offloaded): the
/// new tensor(s) and the chunk's temporaries are all it allocates.
void convert_moment(const at::Tensor& flat, const at::Tensor& scale, const at::Tensor& map, Form to,
                    const at::Tensor& param, const at::TensorOptions& where, at::Tensor& out, at::Tensor& out_scale) {
  const std::int64_t n = param.numel();
  if (to == Form::Fp32) {
    out = at::empty(param.sizes(), where.dtype(at::kFloat));
  } else if (to == Form::Bf16) {
    out = at::empty({n}, where.dtype(at::kBFloat16));
  } else {
    out = at::empty({n}, where.dtype(at::kByte));
    out_scale = at::empty({(n + kQuantBlock - 1) / kQuantBlock}, where.dtype(at::kFloat));
  }
  const at::Tensor out_flat = out.view({-1});
  for (std::int64_t begin = 0; begin < n; begin += AdamW8bit::kChunk) {
    const std::int64_t len = std::min(AdamW8bit::kChunk, n - begin);
    at::Tensor values = read_chunk(flat, scale, map, begin, len);
    if (to != Form::Codes) {
      out_flat.narrow(0, begin, len).copy_(values);
      continue;
    }
    // A non-finite moment spoils its own element, not its block's scale (as in a step).
    values.nan_to_num_(0.0, 0.0, 0.0);
    at::Tensor codes, absmax;
    quantize_blockwise(values, map, codes, absmax);
    out_flat.narrow(0, begin, len).copy_(codes);
    out_scale.narrow(0, begin / kQuantBlock, absmax.numel()).copy_(absmax);
  }
}

/// The stored moment `t` flat in the parameter's logical order (a view when it is contiguous).
at::Tensor flat_of(const at::Tensor& t) { return t.is_contiguous() ? t.view({-1}) : t.contiguous().view({-1}); }

/// Whether LibTorch's AdamW can take `holder`'s states (moments of 32 bits) as they are: each
/// moment on its parameter's device, in its parameter's dtype and shape (AdamW keeps them so;
/// the compact AdamW keeps fp32 ones for a bf16 parameter too).
bool torch_adamw_fits(AdamW8bit& holder) {
  for (auto& group : holder.param_groups()) {
    for (auto& p : group.params()) {
      const auto it = holder.state().find(compat::optimizer_state_key(holder, p));
      if (it == holder.state().end()) continue;
      const auto& st = static_cast<const AdamW8bitParamState&>(*it->second);
      for (const at::Tensor& t : {st.exp_avg(), st.exp_avg_sq()}) {
        if (t.device() != p.device() || t.scalar_type() != p.scalar_type() || t.sizes() != p.sizes()) return false;
      }
    }
  }
  return true;
}

/// LibTorch's AdamW over `holder`'s parameter groups and options, taking its states (fp32
/// moments on their parameters' devices, each step count kept), when it can (torch_adamw_fits);
/// else `holder` itself, which steps them as they are.
std::unique_ptr<torch::optim::Optimizer> as_torch_adamw(std::unique_ptr<AdamW8bit> holder) {
  if (!torch_adamw_fits(*holder)) return holder;
  const auto& defaults = static_cast<const torch::optim::AdamWOptions&>(holder->defaults());
  auto adamw = std::make_unique<torch::optim::AdamW>(holder->param_groups(), defaults);
  for (auto& group : adamw->param_groups()) {
    for (auto& p : group.params()) {
      const auto it = holder->state().find(compat::optimizer_state_key(*holder, p));
      if (it == holder->state().end()) continue;
      const auto& st = static_cast<const AdamW8bitParamState&>(*it->second);
      auto moved = std::make_unique<torch::optim::AdamWParamState>();
      moved->step(st.step());
      moved->exp_avg(st.exp_avg());
      moved->exp_avg_sq(st.exp_avg_sq());
      adamw->state()[compat::optimizer_state_key(*adamw, p)] = std::move(moved);
    }
  }
  return adamw;
}

}  // namespace

MomentConversion with_moment_bits(torch::optim::Optimizer& opt, int bits) {
  const int from = moment_bits_of(opt);
  TRAINER_CHECK(from > 0, "only AdamW's moments change precision (32, 16 or 8 bits)");
  TRAINER_CHECK(bits == 32 || bits == 16 || bits == 8, "AdamW's moments are kept in 32, 16 or 8 bits, not ", bits);
  const auto& defaults = static_cast<const torch::optim::AdamWOptions&>(opt.defaults());
  // Every form of a parameter's state fits an AdamW8bit (fp32 shaped like it, bf16 or 8-bit
  // flat), so it holds the states as they are converted, and those not converted when a
  // conversion runs out of memory. For 32 bits its fp32 states go into LibTorch's AdamW at the end.
  auto holder = std::make_unique<AdamW8bit>(opt.param_groups(), defaults, bits == 32 ? (from == 32 ? 16 : from) : bits);
  const bool offload = offloaded(opt);
  holder->set_offload(offload);
  const at::Tensor smap = quant_map_tensor(true), umap = quant_map_tensor(false);
  MomentConversion out;
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      const auto it = opt.state().find(compat::optimizer_state_key(opt, p));
      if (it == opt.state().end()) continue;
      ++out.total;
      const auto key = compat::optimizer_state_key(*holder, p);
      const StoredMoments was = stored(*it->second);
      const Form to = form_for(bits, p.numel());
      if (out.error.empty() && form_of(was) != to) {
        try {
          // Where the moments are: on the parameter's device, or offloaded in host memory.
          const c10::Device device = was.m.device();
          const at::TensorOptions where =
              device == p.device() ? p.options() : p.options().device(device).pinned_memory(p.device().is_cuda());
          const at::Tensor s_from = smap.to(device), u_from = umap.to(device);
          auto st = std::make_unique<AdamW8bitParamState>();
          st->step(was.step);
          at::Tensor m, m_scale, v, v_scale;
          convert_moment(flat_of(was.m), was.m_scale, s_from, to, p, where, m, m_scale);
          convert_moment(flat_of(was.v), was.v_scale, u_from, to, p, where, v, v_scale);
          st->exp_avg(m);
          st->exp_avg_sq(v);
          if (to == Form::Codes) {
            st->exp_avg_absmax(m_scale);
            st->exp_avg_sq_absmax(v_scale);
          }
          opt.state().erase(it);  // the old moments go as soon as the new ones are there
          holder->state()[key] = std::move(st);
          ++out.converted;
          continue;
        } catch (const std::exception& e) {
          out.error = e.what();
        }
      } else if (out.error.empty()) {
        ++out.converted;  // already in the form asked for (a conversion that stopped part-way before)
      }
      // In its form already, or not converted: it goes over as it is.
      auto moved = std::make_unique<AdamW8bitParamState>();
      moved->step(was.step);
      moved->exp_avg(was.m);
      moved->exp_avg_sq(was.v);
      if (was.m_scale.defined()) {
        moved->exp_avg_absmax(was.m_scale);
        moved->exp_avg_sq_absmax(was.v_scale);
      }
      opt.state().erase(it);
      holder->state()[key] = std::move(moved);
    }
  }
  if (!out.error.empty()) {
    // Part-way: the bits stay those before, and new states are made in them. Going up (fewer
    // savings) what was converted goes back down, as far as memory allows: the savings that
    // were there stay.
    out.bits = from;
    if (bits > from) {
      holder->set_moment_bits(from == 32 ? 16 : from);
      MomentConversion back = with_moment_bits(*holder, from);
      back.error = out.error;
      back.total = out.total;
      back.converted = out.converted;
      back.bits = from;
      back.offload = offload;
      return back;
    }
    holder->set_moment_bits(bits);  // the states not reached are converted by the next request
    out.optimizer = std::move(holder);
    out.offload = offload;
    return out;
  }
  out.bits = bits;
  out.offload = offload;
  if (bits != 32 || offload) {
    holder->set_moment_bits(bits);
    out.optimizer = std::move(holder);
    return out;
  }
  holder->set_moment_bits(32);
  out.optimizer = as_torch_adamw(std::move(holder));
  return out;
}

namespace {

/// `was` where with_offload puts it: in host memory (`on`; pinned for a parameter on a GPU) or
/// on `p`'s device. Moments in LibTorch's AdamW's form for a bf16 or fp16 parameter (Native)
/// go over widened to fp32, the compact AdamW's form for them. On the CPU nothing moves.
StoredMoments placed(const StoredMoments& was, const at::Tensor& p, bool on) {
  const bool widen = on && form_of(was) == Form::Native;
  auto move = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    if (p.device().is_cpu()) return widen ? t.to(at::kFloat) : t;
    const bool in_host = t.device() != p.device();
    if (on && !in_host) return host_copy(t, p.device(), widen ? at::kFloat : t.scalar_type());
    return !on && in_host ? t.to(p.device()) : t;
  };
  return {was.step, move(was.m), move(was.v), move(was.m_scale), move(was.v_scale)};
}

}  // namespace

MomentConversion with_offload(torch::optim::Optimizer& opt, bool on) {
  const int bits = moment_bits_of(opt);
  TRAINER_CHECK(bits > 0, "only AdamW's moments move to host memory");
  if (on) {
    for (const auto& group : opt.param_groups()) {
      for (const auto& p : group.params()) {
        TRAINER_CHECK(p.scalar_type() != at::kDouble,
                      "AdamW's moments of float64 parameters do not move to host memory (the streamed step keeps "
                      "fp32 moments)");
      }
    }
  }
  const auto& defaults = static_cast<const torch::optim::AdamWOptions&>(opt.defaults());
  auto holder = std::make_unique<AdamW8bit>(opt.param_groups(), defaults, bits);
  MomentConversion out;
  out.bits = bits;
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      const auto it = opt.state().find(compat::optimizer_state_key(opt, p));
      if (it == opt.state().end()) continue;
      ++out.total;
      StoredMoments was = stored(*it->second);
      if (out.error.empty()) {
        try {
          was = placed(was, p, on);
          ++out.converted;
        } catch (const std::exception& e) {
          out.error = e.what();
        }
      }
      auto st = std::make_unique<AdamW8bitParamState>();
      st->step(was.step);
      st->exp_avg(was.m);
      st->exp_avg_sq(was.v);
      if (was.m_scale.defined()) {
        st->exp_avg_absmax(was.m_scale);
        st->exp_avg_sq_absmax(was.v_scale);
      }
      opt.state().erase(it);  // the old moments go as soon as the new ones are there
      holder->state()[compat::optimizer_state_key(*holder, p)] = std::move(st);
    }
  }
  if (!out.error.empty() && on) {
    // All or nothing on the way out: what moved goes back (its device memory was just freed).
    for (auto& group : holder->param_groups()) {
      for (auto& p : group.params()) {
        const auto it = holder->state().find(compat::optimizer_state_key(*holder, p));
        if (it == holder->state().end()) continue;
        auto& st = static_cast<AdamW8bitParamState&>(*it->second);
        try {
          const StoredMoments back = placed(stored(st), p, false);
          st.exp_avg(back.m);
          st.exp_avg_sq(back.v);
          st.exp_avg_absmax(back.m_scale);
          st.exp_avg_sq_absmax(back.v_scale);
        } catch (const std::exception&) {
          // Left in host memory: the step streams it.
        }
      }
    }
  }
  // Offloaded when asked and done (on the CPU: the step streams, nothing moved), or while any
  // moment is still in host memory (a way back that ran out of memory part-way).
  bool in_host = false;
  for (auto& group : holder->param_groups()) {
    for (auto& p : group.params()) {
      const auto it = holder->state().find(compat::optimizer_state_key(*holder, p));
      if (it != holder->state().end()) {
        in_host = in_host || static_cast<const AdamW8bitParamState&>(*it->second).exp_avg().device() != p.device();
      }
    }
  }
  out.offload = (on && out.error.empty()) || in_host;
  holder->set_offload(out.offload);
  if (bits == 32 && !out.offload) {
    out.optimizer = as_torch_adamw(std::move(holder));
  } else {
    out.optimizer = std::move(holder);
  }
  return out;
}

}  // namespace trainer::detail
