#include "trainer/activation_checkpoint.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <mutex>

#include "trainer/precision.h"

namespace trainer {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// What the backward needs besides tensors: the block, the parameters it was differentiated
/// for, and the forward's random-number and autocast state. Kept in the node's saved_data as
/// a capsule.
struct Replay : torch::CustomClassHolder {
  std::shared_ptr<Block> block;
  std::vector<at::Tensor> params;  ///< as passed to the forward, in its order
  c10::Device device{c10::kCPU};
  at::Tensor rng_state;      ///< the default generator of `device` before the forward
  at::Tensor cpu_rng_state;  ///< and the CPU's, when `device` is not the CPU
  AutocastState autocast;
  bool input_requires_grad = false;
};

at::Tensor get_rng_state(const c10::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);  // CPU or the GPU's own
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const c10::Device& device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);  // CPU or the GPU's own
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// A generator set to a saved state for the guard's lifetime, then back to where it was (as
/// torch.random.fork_rng). A no-op for an undefined saved state.
class ForkRng {
 public:
  ForkRng(const c10::Device& d, const at::Tensor& saved) : device_(d) {
    if (!saved.defined()) return;
    current_ = get_rng_state(d);
    set_rng_state(device_, saved);
  }
  ~ForkRng() {
    if (!current_.defined()) return;
    try {
      set_rng_state(device_, current_);
    } catch (...) {
      // Setting back a state read from the same generator does not fail; a destructor must not throw.
    }
  }
  ForkRng(const ForkRng&) = delete;
  ForkRng& operator=(const ForkRng&) = delete;

 private:
  c10::Device device_;
  at::Tensor current_;
};

/// Autocast's cache of casted weights off for the guard's lifetime.
/// NOTE: the forward runs with grad mode off; casts cached then have no grad_fn, and a later
/// use of the same weight in the same autocast region would get the detached copy (and its
/// parameter no gradient).
class NoAutocastCache {
 public:
  NoAutocastCache() : previous_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(previous_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool previous_;
};

/// A module's buffers put back, at the guard's end, as they were at its start. Put back only
/// after the recomputed graph has been differentiated: BatchNorm's backward checks that the
/// running statistics it saved were not modified in place since.
class KeepBuffers {
 public:
  explicit KeepBuffers(torch::nn::Module& m) {
    for (const auto& b : m.buffers()) saved_.emplace_back(b, b.clone());
  }
  ~KeepBuffers() {
    at::NoGradGuard no_grad;
    try {
      for (auto& [buffer, before] : saved_) buffer.copy_(before);
    } catch (...) {
      // Copying a clone back into its own buffer does not fail; a destructor must not throw.
    }
  }
  KeepBuffers(const KeepBuffers&) = delete;
  KeepBuffers& operator=(const KeepBuffers&) = delete;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // NOTE: the parameters come as an at::TensorList: LibTorch 1.13 registers a TensorList
  // argument's tensors as inputs of the node, but silently not a std::vector<Tensor>'s (the
  // parameters would get no gradient). The block rides along as a non-tensor argument.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
                               const std::shared_ptr<Block>& block) {
    auto replay = c10::make_intrusive<Replay>();
    replay->block = block;
    replay->params = params.vec();
    replay->device = x.device();
    replay->rng_state = get_rng_state(x.device());
    if (!x.device().is_cpu()) replay->cpu_rng_state = get_rng_state(c10::Device(c10::kCPU));
    replay->autocast = autocast_state();
    replay->input_requires_grad = x.requires_grad();
    ctx->saved_data["replay"] = c10::IValue::make_capsule(replay);
    ctx->save_for_backward({x});
    // Grad mode is off inside a custom Function's forward: nothing of the block is kept.
    const NoAutocastCache no_cache;
    return {block->forward(x)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto replay = c10::static_intrusive_pointer_cast<Replay>(ctx->saved_data["replay"].toCapsule());
    const at::Tensor x = ctx->get_saved_variables()[0];
    const std::vector<at::Tensor>& params = replay->params;
    at::Tensor input = x.detach();
    input.requires_grad_(replay->input_requires_grad);
    // The recomputation must not count as a second forward: BatchNorm in training mode would
    // update its running statistics (and num_batches_tracked) again.
    const KeepBuffers keep(*replay->block);
    at::Tensor out;
    {
      // The same dropout masks as the forward: the device's generator (and the CPU's) as they were.
      const ForkRng rng(replay->device, replay->rng_state);
      const ForkRng cpu_rng(c10::Device(c10::kCPU), replay->cpu_rng_state);
      const AutocastGuard autocast(replay->autocast);  // the same casts as the forward
      const NoAutocastCache no_cache;
      torch::autograd::AutoGradMode grad_mode(true);
      out = replay->block->forward(input);
    }
    std::vector<at::Tensor> inputs;
    if (replay->input_requires_grad) inputs.push_back(input);
    inputs.insert(inputs.end(), params.begin(), params.end());
    variable_list grads;
    if (!inputs.empty() && out.requires_grad()) {
      grads = torch::autograd::grad({out}, inputs, {grad_outputs[0]}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    } else {
      grads.resize(inputs.size());
    }
    // One gradient per forward argument: x, each parameter, and none for the block.
    variable_list result;
    std::size_t k = 0;
    result.push_back(replay->input_requires_grad ? grads[k++] : at::Tensor());
    for (std::size_t i = 0; i < params.size(); ++i) result.push_back(grads[k++]);
    result.emplace_back();
    return result;
  }
};

}  // namespace

at::Tensor checkpoint_block(Block& block, const at::Tensor& x) {
  std::vector<at::Tensor> params;
  for (const auto& p : block.parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (!at::GradMode::is_enabled() || (!x.requires_grad() && params.empty())) return block.forward(x);
  const auto self = std::dynamic_pointer_cast<Block>(block.shared_from_this());
  TRAINER_CHECK(self != nullptr, "checkpoint_block: the block is not owned by a std::shared_ptr");
  return CheckpointFunction::apply(x, at::TensorList(params), self)[0];
}

}  // namespace trainer
