// The learning-rate schedules of [sched]: each a pure function of the optimizer step, with a
// linear warm-up (docs/recipes.md, "Learning-rate schedules").
#include <algorithm>
#include <cmath>
#include <vector>

#include "trainer/error.h"
#include "trainer/optim.h"
#include "trainer/settings.h"

namespace trainer {

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

/// Warm-up, then a decay from lr to min_ratio x lr at the last step (total - 1): a half cosine
/// ("cosine") or a straight line ("linear", like Hugging Face's linear schedule with warm-up,
/// which starts its warm-up at 0 and reaches 0 one step later).
class DecaySchedule final : public LrSchedule {
 public:
  DecaySchedule(double base, std::int64_t warmup, std::int64_t total, double min_ratio, bool cosine)
      : base_(base), warmup_(warmup), total_(total), min_ratio_(min_ratio), cosine_(cosine) {}
  double lr_at(std::int64_t step) const override {
    if (step < warmup_) return base_ * warmup_factor(step, warmup_);
    const double span = std::max<std::int64_t>(1, total_ - 1 - warmup_);
    const double progress = std::min(1.0, double(step - warmup_) / span);
    const double left = cosine_ ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
    return base_ * (min_ratio_ + (1.0 - min_ratio_) * left);
  }

 private:
  double base_;
  std::int64_t warmup_, total_;
  double min_ratio_;
  bool cosine_;
};

/// Warm-up, then the LR times gamma every step (torch's ExponentialLR stepped once per optimizer
/// step); with gamma > 1 it rises, as `trainer lr-find` sweeps.
class ExponentialSchedule final : public LrSchedule {
 public:
  ExponentialSchedule(double base, std::int64_t warmup, double gamma) : base_(base), warmup_(warmup), gamma_(gamma) {}
  double lr_at(std::int64_t step) const override {
    return base_ * warmup_factor(step, warmup_) * std::pow(gamma_, double(step));
  }

 private:
  double base_;
  std::int64_t warmup_;
  double gamma_;
};

/// Warm-up, then the LR times gamma at each milestone passed (torch's MultiStepLR stepped once
/// per optimizer step).
class MultiStepSchedule final : public LrSchedule {
 public:
  MultiStepSchedule(double base, std::int64_t warmup, std::vector<std::int64_t> milestones, double gamma)
      : base_(base), warmup_(warmup), milestones_(std::move(milestones)), gamma_(gamma) {}
  double lr_at(std::int64_t step) const override {
    const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), step) - milestones_.begin();
    return base_ * warmup_factor(step, warmup_) * std::pow(gamma_, double(passed));
  }

 private:
  double base_;
  std::int64_t warmup_;
  std::vector<std::int64_t> milestones_;
  double gamma_;
};

/// torch's OneCycleLR (two phases): from lr / div_factor up to lr at step `peak`, then down to
/// lr / div_factor / final_div_factor at the last step, each phase annealed by a half cosine
/// or a straight line.
class OneCycleSchedule final : public LrSchedule {
 public:
  OneCycleSchedule(double base, double peak_step, std::int64_t total, double div, double final_div, bool cosine)
      : max_(base),
        initial_(base / div),
        min_(base / div / final_div),
        peak_(peak_step),
        last_(double(total - 1)),
        cosine_(cosine) {}
  double lr_at(std::int64_t step) const override {
    const double s = double(step);
    if (s <= peak_) return anneal(initial_, max_, peak_ > 0 ? s / peak_ : 1.0);
    return anneal(max_, min_, std::min(1.0, (s - peak_) / (last_ - peak_)));  // peak_ < last_: checked
  }

 private:
  double anneal(double from, double to, double pct) const {
    return cosine_ ? to + (from - to) / 2.0 * (std::cos(M_PI * pct) + 1.0) : from + (to - from) * pct;
  }
  double max_, initial_, min_, peak_, last_;
  bool cosine_;
};

}  // namespace

namespace {

/// [sched] of "constant" (and the key every schedule has).
struct WarmupSettings : Settings<WarmupSettings> {
  std::int64_t warmup_steps = 0;

  static void declare(SettingsSchema<WarmupSettings>& s) {
    s.add(&WarmupSettings::warmup_steps, "warmup_steps", "Linear warm-up steps").min(0).memory_neutral();
  }
};

/// [sched] of "step".
struct StepDecaySettings : Settings<StepDecaySettings> {
  WarmupSettings warmup;
  std::int64_t step_size = 1000;
  double gamma = 0.1;

  static void declare(SettingsSchema<StepDecaySettings>& s) {
    s.include(&StepDecaySettings::warmup);
    s.add(&StepDecaySettings::step_size, "step_size", "Multiply the LR by gamma every N steps").min(1).memory_neutral();
    s.add(&StepDecaySettings::gamma, "gamma", "Decay factor").min(0, false).max(1).memory_neutral();
  }
};

/// [sched] of "cosine" and "linear" (the same keys: a decay to min_lr_ratio x lr).
struct CosineSettings : Settings<CosineSettings> {
  WarmupSettings warmup;
  double min_lr_ratio = 0.0;

  static void declare(SettingsSchema<CosineSettings>& s) {
    s.include(&CosineSettings::warmup);
    s.add(&CosineSettings::min_lr_ratio, "min_lr_ratio", "Final LR as a fraction of the peak")
        .min(0)
        .max(1)
        .memory_neutral();
  }
};

/// [sched] of "multistep".
struct MultiStepSettings : Settings<MultiStepSettings> {
  WarmupSettings warmup;
  std::vector<std::int64_t> milestones;
  double gamma = 0.1;

  static void declare(SettingsSchema<MultiStepSettings>& s) {
    s.include(&MultiStepSettings::warmup);
    s.add(&MultiStepSettings::milestones, "milestones",
          "Optimizer steps at which the LR is multiplied by gamma, increasing (e.g. [3000, 6000])")
        .min(1)
        .memory_neutral();
    s.add(&MultiStepSettings::gamma, "gamma", "Decay factor").min(0, false).max(1).memory_neutral();
  }
};

/// [sched] of "exponential".
struct ExponentialSettings : Settings<ExponentialSettings> {
  WarmupSettings warmup;
  double gamma = 0.999;

  static void declare(SettingsSchema<ExponentialSettings>& s) {
    s.include(&ExponentialSettings::warmup);
    s.add(&ExponentialSettings::gamma, "gamma", "Multiply the LR by gamma every optimizer step (> 1: it rises)")
        .min(0, false)
        .memory_neutral();
  }
};

/// [sched] of "onecycle".
struct OneCycleSettings : Settings<OneCycleSettings> {
  WarmupSettings warmup;
  double pct_start = 0.3;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  std::string anneal_strategy = "cos";

  static void declare(SettingsSchema<OneCycleSettings>& s) {
    s.include(&OneCycleSettings::warmup);
    s.add(&OneCycleSettings::pct_start, "pct_start",
          "Fraction of the steps spent rising to lr (when warmup_steps is 0; warmup_steps > 0 sets the rise in "
          "steps)")
        .min(0, false)
        .max(1, false)
        .memory_neutral();
    s.add(&OneCycleSettings::div_factor, "div_factor", "The first LR is lr / div_factor").min(1).memory_neutral();
    s.add(&OneCycleSettings::final_div_factor, "final_div_factor", "The last LR is lr / div_factor / final_div_factor")
        .min(1)
        .memory_neutral();
    s.add(&OneCycleSettings::anneal_strategy, "anneal_strategy", "How each phase goes: a half cosine or a line")
        .choices({"cos", "linear"})
        .memory_neutral();
  }
};

}  // namespace

Registry<ScheduleFactory>& schedule_registry() {
  static Registry<ScheduleFactory>* reg = [] {
    auto* r = new Registry<ScheduleFactory>("schedule");
    r->add(
        "constant",
        [](const Config& c, double base, std::int64_t) -> std::unique_ptr<LrSchedule> {
          return std::make_unique<ConstantSchedule>(base, WarmupSettings::from(c).warmup_steps);
        },
        WarmupSettings::keys(), "Constant learning rate after warm-up");
    r->add(
        "step",
        [](const Config& c, double base, std::int64_t) -> std::unique_ptr<LrSchedule> {
          const auto s = StepDecaySettings::from(c);
          return std::make_unique<StepSchedule>(base, s.warmup.warmup_steps, s.step_size, s.gamma);
        },
        StepDecaySettings::keys(), "Step decay");
    r->add(
        "cosine",
        [](const Config& c, double base, std::int64_t total) -> std::unique_ptr<LrSchedule> {
          const auto s = CosineSettings::from(c);
          return std::make_unique<DecaySchedule>(base, s.warmup.warmup_steps, total, s.min_lr_ratio, true);
        },
        CosineSettings::keys(), "Linear warm-up then cosine decay to min_lr_ratio x lr at the last step");
    r->add(
        "linear",
        [](const Config& c, double base, std::int64_t total) -> std::unique_ptr<LrSchedule> {
          const auto s = CosineSettings::from(c);
          return std::make_unique<DecaySchedule>(base, s.warmup.warmup_steps, total, s.min_lr_ratio, false);
        },
        CosineSettings::keys(), "Linear warm-up then linear decay to min_lr_ratio x lr at the last step");
    r->add(
        "exponential",
        [](const Config& c, double base, std::int64_t) -> std::unique_ptr<LrSchedule> {
          const auto s = ExponentialSettings::from(c);
          return std::make_unique<ExponentialSchedule>(base, s.warmup.warmup_steps, s.gamma);
        },
        ExponentialSettings::keys(), "Multiply the LR by gamma every step (after warm-up)");
    r->add(
        "multistep",
        [](const Config& c, double base, std::int64_t) -> std::unique_ptr<LrSchedule> {
          const auto s = MultiStepSettings::from(c);
          TRAINER_CHECK_T(UsageError, !s.milestones.empty(), "sched.milestones: empty; name the optimizer steps ",
                          "at which the LR decays, e.g. milestones = [3000, 6000]");
          for (std::size_t i = 1; i < s.milestones.size(); ++i) {
            TRAINER_CHECK_T(UsageError, s.milestones[i] > s.milestones[i - 1], "sched.milestones: must increase, got ",
                            s.milestones[i - 1], " then ", s.milestones[i]);
          }
          return std::make_unique<MultiStepSchedule>(base, s.warmup.warmup_steps, s.milestones, s.gamma);
        },
        MultiStepSettings::keys(), "Multiply the LR by gamma at each of the milestones (after warm-up)");
    r->add(
        "onecycle",
        [](const Config& c, double base, std::int64_t total) -> std::unique_ptr<LrSchedule> {
          const auto s = OneCycleSettings::from(c);
          // torch: the peak at step pct_start x total - 1; a warm-up of W steps peaks at W - 1.
          const double peak =
              s.warmup.warmup_steps > 0 ? double(s.warmup.warmup_steps - 1) : s.pct_start * double(total) - 1.0;
          TRAINER_CHECK_T(UsageError, peak < double(total - 1), "sched.warmup_steps = ", s.warmup.warmup_steps,
                          ": the one-cycle rise must end before the last of the run's ", total, " steps");
          // A peak before step 0 (pct_start x total < 1): torch starts in the falling phase, as this does.
          return std::make_unique<OneCycleSchedule>(base, peak, total, s.div_factor, s.final_div_factor,
                                                    s.anneal_strategy == "cos");
        },
        OneCycleSettings::keys(),
        "One cycle (torch's OneCycleLR): up from lr / div_factor to lr, then down to lr / div_factor / "
        "final_div_factor at the last step");
    return r;
  }();
  return *reg;
}

}  // namespace trainer
