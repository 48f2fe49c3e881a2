#include "train/memory_format.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "train/oom_recovery.h"
#include "train/setup.h"
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
  if (setting == "contiguous") {
    parts.memory_format = at::MemoryFormat::Contiguous;
    return;
  }
  if (setting == "channels_last") {
    to_memory_format(parts, at::MemoryFormat::ChannelsLast);
    log.info("memory format: channels_last (model.memory_format)");
    return;
  }
  TRAINER_CHECK(setting == "auto", "model.memory_format = \"", setting,
                "\": allowed are auto, contiguous, channels_last");
  double ms[2];
  const at::MemoryFormat f = probe_memory_format(parts, batch, 3, ms);
  to_memory_format(parts, f);
  if (ms[0] == 0) {
    log.warn("memory format: contiguous (model.memory_format = auto: the probe ran out of memory)");
    return;
  }
  log.info(
      "memory format: {} (model.memory_format = auto: forward+backward {:.1f} ms contiguous, {:.1f} ms "
      "channels_last on {})",
      f == at::MemoryFormat::ChannelsLast ? "channels_last" : "contiguous", ms[0], ms[1], parts.device.str());
}

}  // namespace trainer
