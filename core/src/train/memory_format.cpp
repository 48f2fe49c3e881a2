#include "train/memory_format.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "train/oom_recovery.h"
#include "train/setup.h"
#include "trainer/distributed.h"
#include "trainer/error.h"
#include "trainer/memory.h"

namespace trainer {

namespace {

void synchronize(const c10::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

/// The best of `reps` timed forward+backward passes after one warm-up, in milliseconds.
double time_passes(Model& m, const Task& task, const Batch& b, const c10::Device& device, int reps) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= reps; ++i) {
    synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    task.mean_loss(m.forward(b.inputs), b.targets).backward();
    synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    drop_gradients(m);
    if (i > 0) best = std::min(best, ms);
  }
  return best;
}

/// Converts the model's 4-D parameters and buffers (convolution weights) to `format`, in place.
void to_memory_format(RunParts& parts, at::MemoryFormat format) {
  at::NoGradGuard no_grad;
  for (auto& p : parts.model->parameters()) {
    if (p.dim() == 4 && !p.is_contiguous(format)) p.set_data(p.contiguous(format));
  }
  for (auto& b : parts.model->buffers()) {
    if (b.dim() == 4 && !b.is_contiguous(format)) b.set_data(b.contiguous(format));
  }
  parts.memory_format = format;
}

/// Times `reps` forward+backward passes of the model on up to 64 real training samples in each
/// format (the best of each, after a warm-up pass) and returns the faster one; channels-last
/// must win by 3 % or more, or the model stays contiguous. The model runs in eval mode (no
/// BatchNorm statistics move, no dropout is drawn) and is left contiguous with no gradients; an
/// out-of-memory error during the probe answers contiguous with `ms` = {0, 0}, else `ms`
/// receives the two times.
at::MemoryFormat probe_memory_format(RunParts& parts, std::int64_t batch, int reps, double ms[2]) {
  ms[0] = ms[1] = 0;
  Model& m = *parts.model;
  const bool was_training = m.is_training();
  m.eval();  // BatchNorm uses its running statistics and does not update them; no dropout
  at::MemoryFormat chosen = at::MemoryFormat::Contiguous;
  try {
    const std::int64_t n = std::min<std::int64_t>({batch, 64, parts.train_set->size()});
    const Batch host = parts.train_set->get(at::arange(n, at::kLong));
    const at::Tensor inputs = to_device(parts, host).inputs;
    const at::Tensor targets = host.targets.to(parts.device);
    to_memory_format(parts, at::MemoryFormat::Contiguous);
    ms[0] = time_passes(m, *parts.task, {inputs.contiguous(), targets}, parts.device, reps);
    to_memory_format(parts, at::MemoryFormat::ChannelsLast);
    ms[1] =
        time_passes(m, *parts.task, {inputs.contiguous(at::MemoryFormat::ChannelsLast), targets}, parts.device, reps);
    if (ms[1] <= 0.97 * ms[0]) chosen = at::MemoryFormat::ChannelsLast;
  } catch (const std::exception& e) {
    drop_gradients(m);
    if (!is_out_of_memory(e)) {
      if (was_training) m.train();
      to_memory_format(parts, at::MemoryFormat::Contiguous);
      throw;
    }
    ms[0] = ms[1] = 0;  // no measurement: contiguous
  }
  to_memory_format(parts, at::MemoryFormat::Contiguous);
  if (was_training) m.train();
  return chosen;
}

}  // namespace

void choose_memory_format(RunParts& parts, const std::string& setting, std::int64_t batch, spdlog::logger& log) {
  TRAINER_CHECK(setting == "auto" || setting == "contiguous" || setting == "channels_last", "model.memory_format = \"",
                setting, "\": allowed are auto, contiguous, channels_last");
  // Every rank of a data-parallel run holds its model in rank 0's format: rank 0's weights reach
  // the others as raw memory, and each rank's probe could time the formats the other way round.
  const bool follows = parts.group && parts.group->rank() != 0;
  double ms[2] = {0, 0};
  at::MemoryFormat f = setting == "channels_last" ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (setting == "auto" && !follows) f = probe_memory_format(parts, batch, 3, ms);
  const char* const kNames[] = {"contiguous", "channels_last"};
  if (parts.group) {
    const std::string agreed = parts.group->share("memory_format", kNames[f == at::MemoryFormat::ChannelsLast]);
    f = agreed == kNames[1] ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  }
  // Also when it is the default: a plugin may have changed the layout in ModelCreated.
  to_memory_format(parts, f);
  const char* name = kNames[f == at::MemoryFormat::ChannelsLast];
  if (setting != "auto") {
    if (f == at::MemoryFormat::ChannelsLast) log.info("memory format: channels_last (model.memory_format)");
  } else if (follows) {
    log.info("memory format: {} (model.memory_format = auto: rank 0's probe, for every rank)", name);
  } else if (ms[0] == 0) {
    log.warn("memory format: contiguous (model.memory_format = auto: the probe ran out of memory)");
  } else {
    log.info(
        "memory format: {} (model.memory_format = auto: forward+backward {:.1f} ms contiguous, {:.1f} ms "
        "channels_last on {})",
        name, ms[0], ms[1], parts.device.str());
  }
}

}  // namespace trainer
