#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>

#include "trainer/error.h"
#include "trainer/optim.h"
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
  TRAINER_CHECK(opt.state().empty(), "cannot move the state of this optimizer to ", device.str(),
                ": trainer knows the state of AdamW and SGD only");
  return moved;
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
  // AdamW: sqrt(exp_avg_sq) and its quotient live together; unknown optimizers: assume 2.
  return 2;
}

double get_learning_rate(const torch::optim::Optimizer& opt) {
  TRAINER_ASSERT(!opt.param_groups().empty());
  return opt.param_groups().front().options().get_lr();
}

Registry<OptimizerFactory>& optimizer_registry() {
  static Registry<OptimizerFactory>* reg = [] {
    auto* r = new Registry<OptimizerFactory>("optimizer");
    using T = ValueType;
    r->add(
        "sgd",
        [](const Config& c, std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
          torch::optim::SGDOptions o(c.get<double>("lr"));
          o.momentum(c.get<double>("momentum"))
              .nesterov(c.get<bool>("nesterov"))
              .weight_decay(c.get<double>("weight_decay"));
          if (o.nesterov() && o.momentum() <= 0) {
            throw ConfigError({detail::str(c.origin("nesterov"), ": optim.nesterov = true needs optim.momentum > 0")});
          }
          return std::make_unique<torch::optim::SGD>(std::move(params), o);
        },
        {KeySpec("lr", T::Float, "Learning rate").def(0.01).min(0, false),
         KeySpec("momentum", T::Float, "Momentum factor").def(0.0).min(0).max(1, false),
         KeySpec("nesterov", T::Bool, "Nesterov momentum (needs momentum > 0)").def(false),
         KeySpec("weight_decay", T::Float, "L2 penalty").def(0.0).min(0)},
        "Stochastic gradient descent");
    r->add(
        "adamw",
        [](const Config& c, std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
          const auto betas = c.get<std::vector<double>>("betas");
          if (betas.size() != 2) {
            throw ConfigError({detail::str(c.origin("betas"), ": optim.betas must hold 2 values, got ", betas.size())});
          }
          torch::optim::AdamWOptions o(c.get<double>("lr"));
          o.betas({betas[0], betas[1]}).eps(c.get<double>("eps")).weight_decay(c.get<double>("weight_decay"));
          return std::make_unique<torch::optim::AdamW>(std::move(params), o);
        },
        {KeySpec("lr", T::Float, "Learning rate").def(1e-3).min(0, false),
         KeySpec("betas", T::FloatList, "Adam beta1, beta2").def(std::vector<double>{0.9, 0.999}).min(0).max(1, false),
         KeySpec("eps", T::Float, "Denominator epsilon").def(1e-8).min(0, false),
         KeySpec("weight_decay", T::Float, "Decoupled weight decay").def(0.01).min(0)},
        "Adam with decoupled weight decay");
    return r;
  }();
  return *reg;
}

namespace {

double warmup_factor(std::int64_t step, std::int64_t warmup) {
  return warmup > 0 && step < warmup ? double(step + 1) / double(warmup) : 1.0;
}

class ConstantSchedule final : public LrSchedule {
 public:
  ConstantSchedule(double base, std::int64_t warmup) : base_(base), warmup_(warmup) {}
  double lr_at(std::int64_t step) const override { return base_ * warmup_factor(step, warmup_); }

 private:
  double base_;
  std::int64_t warmup_;
};

class StepSchedule final : public LrSchedule {
 public:
  StepSchedule(double base, std::int64_t warmup, std::int64_t step_size, double gamma)
      : base_(base), warmup_(warmup), step_size_(step_size), gamma_(gamma) {}
  double lr_at(std::int64_t step) const override {
    return base_ * warmup_factor(step, warmup_) * std::pow(gamma_, double(step / step_size_));
  }

 private:
  double base_;
  std::int64_t warmup_, step_size_;
  double gamma_;
};

class CosineSchedule final : public LrSchedule {
 public:
  CosineSchedule(double base, std::int64_t warmup, std::int64_t total, double min_ratio)
      : base_(base), warmup_(warmup), total_(total), min_ratio_(min_ratio) {}
  double lr_at(std::int64_t step) const override {
    if (step < warmup_) return base_ * warmup_factor(step, warmup_);
    // The last step taken is total - 1: that is where the LR reaches min_lr_ratio * lr.
    const double span = std::max<std::int64_t>(1, total_ - 1 - warmup_);
    const double progress = std::min(1.0, double(step - warmup_) / span);
    const double cos = 0.5 * (1.0 + std::cos(M_PI * progress));
    return base_ * (min_ratio_ + (1.0 - min_ratio_) * cos);
  }

 private:
  double base_;
  std::int64_t warmup_, total_;
  double min_ratio_;
};

}  // namespace

Registry<ScheduleFactory>& schedule_registry() {
  static Registry<ScheduleFactory>* reg = [] {
    auto* r = new Registry<ScheduleFactory>("schedule");
    using T = ValueType;
    const KeySpec warmup = KeySpec("warmup_steps", T::Int, "Linear warm-up steps").def(std::int64_t{0}).min(0);
    r->add(
        "constant",
        [](const Config& c, double base, std::int64_t) -> std::unique_ptr<LrSchedule> {
          return std::make_unique<ConstantSchedule>(base, c.get<std::int64_t>("warmup_steps"));
        },
        {warmup}, "Constant learning rate after warm-up");
    r->add(
        "step",
        [](const Config& c, double base, std::int64_t) -> std::unique_ptr<LrSchedule> {
          return std::make_unique<StepSchedule>(base, c.get<std::int64_t>("warmup_steps"),
                                                c.get<std::int64_t>("step_size"), c.get<double>("gamma"));
        },
        {warmup, KeySpec("step_size", T::Int, "Multiply the LR by gamma every N steps").def(std::int64_t{1000}).min(1),
         KeySpec("gamma", T::Float, "Decay factor").def(0.1).min(0, false).max(1)},
        "Step decay");
    r->add(
        "cosine",
        [](const Config& c, double base, std::int64_t total) -> std::unique_ptr<LrSchedule> {
          return std::make_unique<CosineSchedule>(base, c.get<std::int64_t>("warmup_steps"), total,
                                                  c.get<double>("min_lr_ratio"));
        },
        {warmup, KeySpec("min_lr_ratio", T::Float, "Final LR as a fraction of the peak").def(0.0).min(0).max(1)},
        "Linear warm-up then cosine decay to min_lr_ratio x lr at the last step");
    return r;
  }();
  return *reg;
}

}  // namespace trainer
