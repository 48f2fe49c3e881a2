#pragma once
// Private: the frozen base of a run that trains part of its model (LoRA adapters, a probe's
// head): which parameters do not train, and a digest of their values, which checkpoints and
// adapter files record so that they are applied to the weights they were trained over only.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace trainer {
class Model;
}

namespace trainer::detail {

/// The parameters of `model` that do not train (requires_grad false), by name, in its order.
std::vector<std::pair<std::string, at::Tensor>> frozen_parameters(Model& model);

/// What trains and what moves: every parameter that trains and every buffer (BatchNorm's
/// running statistics move in train mode), by name.
std::map<std::string, at::Tensor> trained_state(Model& model);

/// trainer::frozen_base_digest() (trainer/lora.h) computed again only when a frozen parameter changed: another tensor,
/// or one written in place (its version counter).
class FrozenBaseDigest {
 public:
  const std::string& of(Model& model);

 private:
  std::vector<std::pair<const void*, std::int64_t>> key_;
  std::string digest_;
};

}  // namespace trainer::detail
