#pragma once
// Private: the memory format of a convolutional model's 4-D tensors (contiguous NCHW or
// channels-last NHWC), chosen per run: by the model's `memory_format` key, or for "auto" by a
// probe that times both on this machine. Which one is faster depends on the CPU (oneDNN's
// kernels) or GPU, so it is measured, not assumed.
#include <cstdint>
#include <string>

namespace spdlog {
class logger;
}

namespace trainer {

struct RunParts;

/// Applies `model.memory_format` ("auto", "contiguous", "channels_last"; only models that
/// declare the key have it) to parts.model's 4-D parameters and buffers and to
/// parts.memory_format, logging the choice and, for "auto", the probe's times: 3 forward+backward
/// passes per format (after a warm-up) on up to 64 real training samples, in eval mode (no
/// BatchNorm statistics move, no dropout is drawn), no gradients left; channels-last must win by
/// 3 % or more; an out-of-memory error during the probe answers contiguous. `batch` is the
/// training micro-batch.
void choose_memory_format(RunParts& parts, const std::string& setting, std::int64_t batch, spdlog::logger& log);

}  // namespace trainer
