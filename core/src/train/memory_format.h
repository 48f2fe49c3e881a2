#pragma once
// Private: the memory format of a convolutional model's 4-D tensors (contiguous NCHW or
// channels-last NHWC), chosen per run: by the model's `memory_format` key, or for "auto" by a
// probe that times both on this machine. Which one is faster depends on the CPU (oneDNN's
// kernels) or GPU, so it is measured, not assumed.
#include <c10/core/MemoryFormat.h>

#include <cstdint>
#include <string>

namespace spdlog {
class logger;
}

namespace trainer {

struct RunParts;

/// Times `reps` forward+backward passes of the model on `batch` real training samples in each
/// format (the best of each, after a warm-up pass) and returns the faster one; channels-last
/// must win by 3 % or more, or the model stays contiguous. The model runs in eval mode (no
/// BatchNorm statistics move, no dropout is drawn) and is left in `contiguous` with no gradients;
/// an out-of-memory error during the probe answers contiguous. `ms` receives the two times.
at::MemoryFormat probe_memory_format(RunParts& parts, std::int64_t batch, int reps, double ms[2]);

/// Converts the model's 4-D parameters and buffers (convolution weights) to `format`, in place.
void to_memory_format(RunParts& parts, at::MemoryFormat format);

/// Applies `model.memory_format` ("auto", "contiguous", "channels_last"; absent for models
/// without the key) to parts.model and parts.memory_format, logging the choice and, for "auto",
/// the probe's times. `batch` is the training micro-batch (the probe uses at most 64 samples).
void choose_memory_format(RunParts& parts, const std::string& setting, std::int64_t batch, spdlog::logger& log);

}  // namespace trainer
