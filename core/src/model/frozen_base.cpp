// The frozen base of a partly trained model and its digest (model/frozen_base.h).
#include "model/frozen_base.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>

#include "trainer/lora.h"
#include "trainer/model.h"

namespace trainer::detail {

namespace {

constexpr std::uint64_t kPrime = 1099511628211ULL;

/// FNV-1a, a byte at a time.
void mix_bytes(std::uint64_t& h, const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kPrime;
}

/// FNV-1a's step over 8-byte words (many megabytes at memory speed), each followed by an
/// xor-shift that carries the high bits into the low ones (a multiplication alone never moves a
/// difference downwards, so two flipped sign bits would cancel); the tail a byte at a time.
void mix_data(std::uint64_t& h, const unsigned char* p, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * kPrime;
    h ^= h >> 32;
  }
  mix_bytes(h, p + i, n - i);
}

void mix_text(std::uint64_t& h, const std::string& s) {
  mix_bytes(h, reinterpret_cast<const unsigned char*>(s.data()), s.size() + 1);  // with its end
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> frozen_parameters(Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model.named_parameters()) {
    if (!p.value().requires_grad()) out.emplace_back(p.key(), p.value());
  }
  return out;
}

std::map<std::string, at::Tensor> trained_state(Model& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) {
    if (p.value().requires_grad()) out[p.key()] = p.value();
  }
  for (const auto& b : model.named_buffers()) out[b.key()] = b.value();
  return out;
}

}  // namespace trainer::detail

namespace trainer {

std::string frozen_base_digest(Model& model) {
  std::uint64_t h = 14695981039346656037ULL;
  std::int64_t tensors = 0, elements = 0;
  for (const auto& [name, t] : detail::frozen_parameters(model)) {
    detail::mix_text(h, name);
    detail::mix_text(h, c10::toString(t.scalar_type()));
    for (const std::int64_t d : t.sizes()) detail::mix_text(h, std::to_string(d));
    const at::Tensor data = t.detach().to(at::kCPU).contiguous();
    detail::mix_data(h, static_cast<const unsigned char*>(data.data_ptr()), data.nbytes());
    ++tensors;
    elements += t.numel();
  }
  return fmt::format("frozen-digest-v1:{:016x} ({} tensors, {} elements)", h, tensors, elements);
}

}  // namespace trainer

namespace trainer::detail {

const std::string& FrozenBaseDigest::of(Model& model) {
  std::vector<std::pair<const void*, std::int64_t>> key;
  for (const auto& [name, t] : frozen_parameters(model)) key.emplace_back(t.unsafeGetTensorImpl(), t._version());
  if (digest_.empty() || key != key_) {
    digest_ = frozen_base_digest(model);
    key_ = std::move(key);
  }
  return digest_;
}

}  // namespace trainer::detail
