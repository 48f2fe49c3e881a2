#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "trainer/config.h"
#include "trainer/export.h"
#include "trainer/registry.h"

namespace torch::optim {
class Optimizer;
}

namespace trainer {

/// Builds an optimizer over `params` from its config section (`optim.*`).
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(const Config& section, std::vector<at::Tensor> params)>;

/// The process-wide optimizer registry (built-ins: "sgd", "adamw", "adamw8bit").
TRAINER_API Registry<OptimizerFactory>& optimizer_registry();

/// A learning-rate schedule: the learning rate for optimizer step `step` (0-based).
class TRAINER_API LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr_at(std::int64_t step) const = 0;
};

/// Builds a schedule from `sched.*`, the optimizer's base learning rate and the run's total
/// optimizer steps.
using ScheduleFactory =
    std::function<std::unique_ptr<LrSchedule>(const Config& section, double base_lr, std::int64_t total_steps)>;

/// The process-wide schedule registry (built-ins: "constant", "step", "cosine").
TRAINER_API Registry<ScheduleFactory>& schedule_registry();

/// Creates the per-parameter state the built-in optimizers would create lazily at their
/// first step (AdamW: step 0 and zero moments; SGD with momentum: a zero buffer), so that a
/// step allocates temporaries only. The first step then computes exactly what it would have
/// without this. Returns false for optimizers it does not know (their state stays lazy).
TRAINER_API bool materialize_optimizer_state(torch::optim::Optimizer& opt);

/// Moves every state tensor of `opt` (AdamW moments, SGD momentum buffers) to `device`, one
/// tensor at a time so that at most one tensor exists twice. Parameters are not touched (move
/// the model with Module::to, which keeps each parameter's identity, so the state keys stay
/// valid). Returns the bytes moved; throws trainer::Error for an optimizer it does not know.
TRAINER_API std::int64_t move_optimizer_state(torch::optim::Optimizer& opt, const c10::Device& device);

/// The state tensors `opt` holds for the parameter `param` (AdamW: exp_avg, exp_avg_sq and
/// max_exp_avg_sq when defined, each shaped like the parameter; SGD: momentum_buffer, shaped
/// like it; adamw8bit and AdamW with moments in 16 or 8 bits: the moments, flat, as bf16 values
/// or 8-bit codes with their per-block scales, or fp32 shaped like it for small tensors). Empty
/// when it holds none yet or for optimizers it does not know.
TRAINER_API std::vector<at::Tensor> optimizer_state_of(const torch::optim::Optimizer& opt, const at::Tensor& param);
/// The bytes of optimizer_state_of(opt, p) over `params`; with `on_their_devices` only the
/// tensors on their parameter's device (not those offloaded to host memory).
TRAINER_API std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& opt,
                                               const std::vector<at::Tensor>& params, bool on_their_devices = false);

/// How many parameter-sized temporaries one step of `opt` holds at once (its peak extra
/// memory is that times the largest parameter): AdamW 2, SGD 0 to 2 depending on weight
/// decay and Nesterov; 2 for optimizers it does not know.
TRAINER_API int optimizer_step_temporaries(const torch::optim::Optimizer& opt);

/// Sets the learning rate of every parameter group (SGD, Adam, AdamW, RMSprop, Adagrad).
TRAINER_API void set_learning_rate(torch::optim::Optimizer& opt, double lr);
/// Learning rate of the first parameter group.
TRAINER_API double get_learning_rate(const torch::optim::Optimizer& opt);

}  // namespace trainer
