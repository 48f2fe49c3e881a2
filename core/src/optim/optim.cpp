#include <fmt/format.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "optim/adamw8bit.h"
#include "trainer/error.h"
#include "trainer/optim.h"
#include "trainer/settings.h"
#include "util/torch_compat.h"

namespace trainer {

void set_learning_rate(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

bool materialize_optimizer_state(torch::optim::Optimizer& opt) {
  auto key = [&opt](const at::Tensor& p) { return compat::optimizer_state_key(opt, p); };
  if (auto* adamw = dynamic_cast<torch::optim::AdamW*>(&opt)) {
    for (auto& group : adamw->param_groups()) {
      const bool amsgrad = static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad();
      for (auto& p : group.params()) {
        if (adamw->state().count(key(p))) continue;
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        st->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (amsgrad) st->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        adamw->state()[key(p)] = std::move(st);
      }
    }
    return true;
  }
  if (auto* eight = dynamic_cast<detail::AdamW8bit*>(&opt)) {
    for (auto& group : eight->param_groups()) {
      for (auto& p : group.params()) eight->state_of(p);
    }
    return true;
  }
  if (auto* sgd = dynamic_cast<torch::optim::SGD*>(&opt)) {
    for (auto& group : sgd->param_groups()) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      // With dampening the lazy first buffer (a clone of the gradient) differs from a
      // zero buffer updated once; trainer's SGD has no dampening key, so this holds.
      if (o.momentum() == 0 || o.dampening() != 0) continue;
      for (auto& p : group.params()) {
        if (sgd->state().count(key(p))) continue;
        auto st = std::make_unique<torch::optim::SGDParamState>();
        st->momentum_buffer(at::zeros_like(p, at::MemoryFormat::Preserve));
        sgd->state()[key(p)] = std::move(st);
      }
    }
    return true;
  }
  return false;
}

std::int64_t move_optimizer_state(torch::optim::Optimizer& opt, const c10::Device& device) {
  std::int64_t moved = 0;
  auto move = [&](const at::Tensor& t) {
    if (!t.defined() || t.device() == device) return t;
    moved += static_cast<std::int64_t>(t.nbytes());
    return t.to(device);
  };
  if (auto* adamw = dynamic_cast<torch::optim::AdamW*>(&opt)) {
    for (auto& [key, base] : adamw->state()) {
      auto& st = static_cast<torch::optim::AdamWParamState&>(*base);
      st.exp_avg(move(st.exp_avg()));
      st.exp_avg_sq(move(st.exp_avg_sq()));
      st.max_exp_avg_sq(move(st.max_exp_avg_sq()));
    }
    return moved;
  }
  if (auto* sgd = dynamic_cast<torch::optim::SGD*>(&opt)) {
    for (auto& [key, base] : sgd->state()) {
      auto& st = static_cast<torch::optim::SGDParamState&>(*base);
      st.momentum_buffer(move(st.momentum_buffer()));
    }
    return moved;
  }
  if (auto* eight = dynamic_cast<detail::AdamW8bit*>(&opt)) {
    // Offloaded moments stay in host memory wherever the parameters go (the step streams them),
    // and any a move left on a device go there too.
    const c10::Device to = eight->offload() ? c10::Device(c10::kCPU) : device;
    auto move_state = [&](const at::Tensor& t) {
      if (!t.defined() || t.device() == to) return t;
      moved += static_cast<std::int64_t>(t.nbytes());
      return t.to(to);
    };
    for (auto& [key, base] : eight->state()) {
      auto& st = static_cast<detail::AdamW8bitParamState&>(*base);
      st.exp_avg(move_state(st.exp_avg()));
      st.exp_avg_sq(move_state(st.exp_avg_sq()));
      st.exp_avg_absmax(move_state(st.exp_avg_absmax()));
      st.exp_avg_sq_absmax(move_state(st.exp_avg_sq_absmax()));
    }
    return moved;
  }
  TRAINER_CHECK(opt.state().empty(), "cannot move the state of this optimizer to ", device.str(),
                ": trainer knows the state of AdamW, AdamW8bit and SGD only");
  return moved;
}

std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params,
                                   bool on_their_devices) {
  std::int64_t bytes = 0;
  for (const auto& p : params) {
    for (const auto& t : optimizer_state_of(opt, p)) {
      if (!on_their_devices || t.device() == p.device()) bytes += static_cast<std::int64_t>(t.nbytes());
    }
  }
  return bytes;
}

std::vector<at::Tensor> optimizer_state_of(const torch::optim::Optimizer& opt, const at::Tensor& param) {
  std::vector<at::Tensor> out;
  auto& o = const_cast<torch::optim::Optimizer&>(opt);  // state() has no const overload
  const auto it = o.state().find(compat::optimizer_state_key(o, param));
  if (it == o.state().end()) return out;
  auto add = [&out](const at::Tensor& t) {
    if (t.defined()) out.push_back(t);
  };
  if (dynamic_cast<const torch::optim::AdamW*>(&opt)) {
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    add(st.exp_avg());
    add(st.exp_avg_sq());
    add(st.max_exp_avg_sq());
  } else if (dynamic_cast<const torch::optim::SGD*>(&opt)) {
    add(static_cast<const torch::optim::SGDParamState&>(*it->second).momentum_buffer());
  } else if (dynamic_cast<const detail::AdamW8bit*>(&opt)) {
    const auto& st = static_cast<const detail::AdamW8bitParamState&>(*it->second);
    add(st.exp_avg());
    add(st.exp_avg_sq());
    add(st.exp_avg_absmax());
    add(st.exp_avg_sq_absmax());
  }
  return out;
}

int optimizer_step_temporaries(const torch::optim::Optimizer& opt) {
  if (const auto* sgd = dynamic_cast<const torch::optim::SGD*>(&opt)) {
    int most = 0;
    for (const auto& group : sgd->param_groups()) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      // weight decay: d_p = d_p.add(p, wd); Nesterov: d_p = d_p.add(buf, m) while the first lives.
      most = std::max(most, int(o.weight_decay() != 0) + int(o.nesterov()));
    }
    return most;
  }
  // AdamW8bit: a chunk's temporaries (the step reserves AdamW8bit::step_temporary_bytes, which
  // is exact in bytes); one parameter-sized here.
  if (dynamic_cast<const detail::AdamW8bit*>(&opt)) return 1;
  // AdamW: sqrt(exp_avg_sq) and its quotient live together; unknown optimizers: assume 2.
  return 2;
}

double get_learning_rate(const torch::optim::Optimizer& opt) {
  TRAINER_ASSERT(!opt.param_groups().empty());
  return opt.param_groups().front().options().get_lr();
}

namespace {

/// [optim] of "sgd".
struct SgdSettings : Settings<SgdSettings> {
  double lr = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;

  static void declare(SettingsSchema<SgdSettings>& s) {
    s.add(&SgdSettings::lr, "lr", "Learning rate").min(0, false).memory_neutral();
    s.add(&SgdSettings::momentum, "momentum", "Momentum factor").min(0).max(1, false);
    s.add(&SgdSettings::nesterov, "nesterov", "Nesterov momentum (needs momentum > 0)");
    s.add(&SgdSettings::weight_decay, "weight_decay", "L2 penalty").min(0);
  }
};

/// [optim] of "adamw".
struct AdamWSettings : Settings<AdamWSettings> {
  double lr = 1e-3;
  std::vector<double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.01;

  static void declare(SettingsSchema<AdamWSettings>& s) {
    s.add(&AdamWSettings::lr, "lr", "Learning rate").min(0, false).memory_neutral();
    s.add(&AdamWSettings::betas, "betas", "Adam beta1, beta2").min(0).max(1, false);
    s.add(&AdamWSettings::eps, "eps", "Denominator epsilon").min(0, false);
    s.add(&AdamWSettings::weight_decay, "weight_decay", "Decoupled weight decay").min(0);
  }
};

/// The AdamW options of an [optim] section of "adamw" or "adamw8bit".
torch::optim::AdamWOptions adamw_options(const Config& c) {
  const auto s = AdamWSettings::from(c);
  if (s.betas.size() != 2) {
    throw ConfigError({fmt::format("{}: optim.betas must hold 2 values, got {}", c.origin("betas"), s.betas.size())});
  }
  torch::optim::AdamWOptions o(s.lr);
  o.betas({s.betas[0], s.betas[1]}).eps(s.eps).weight_decay(s.weight_decay);
  return o;
}

}  // namespace

Registry<OptimizerFactory>& optimizer_registry() {
  static Registry<OptimizerFactory>* reg = [] {
    auto* r = new Registry<OptimizerFactory>("optimizer");
    r->add(
        "sgd",
        [](const Config& c, std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
          const auto s = SgdSettings::from(c);
          if (s.nesterov && s.momentum <= 0) {
            throw ConfigError(
                {fmt::format("{}: optim.nesterov = true needs optim.momentum > 0", c.origin("nesterov"))});
          }
          torch::optim::SGDOptions o(s.lr);
          o.momentum(s.momentum).nesterov(s.nesterov).weight_decay(s.weight_decay);
          return std::make_unique<torch::optim::SGD>(std::move(params), o);
        },
        SgdSettings::keys(), "Stochastic gradient descent");
    r->add(
        "adamw",
        [](const Config& c, std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
          return std::make_unique<torch::optim::AdamW>(std::move(params), adamw_options(c));
        },
        AdamWSettings::keys(), "Adam with decoupled weight decay");
    r->add(
        "adamw8bit",
        [](const Config& c, std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
          return std::make_unique<detail::AdamW8bit>(std::move(params), adamw_options(c));
        },
        AdamWSettings::keys(),
        "AdamW with its moments in 8 bits, block-wise (bitsandbytes' method): about a quarter of AdamW's "
        "state; tensors under 4096 values keep fp32 moments");
    return r;
  }();
  return *reg;
}

}  // namespace trainer
