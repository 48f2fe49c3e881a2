#include "dist/grad_sync.h"

#include <ATen/ATen.h>

#include <array>

#include "trainer/distributed.h"
#include "trainer/error.h"

namespace trainer {

namespace {

constexpr std::array<const char*, 6> kPhases = {"", "data", "forward", "backward", "all_reduce", "optimizer_step"};

}  // namespace

std::int64_t phase_code(const std::string& phase) {
  for (std::size_t i = 1; i < kPhases.size(); ++i) {
    if (phase == kPhases[i]) return static_cast<std::int64_t>(i);
  }
  return 2;  // a phase without a code of its own counts as the forward (a micro-batch can help)
}

const char* phase_name(std::int64_t code) {
  return code > 0 && code < static_cast<std::int64_t>(kPhases.size()) ? kPhases[static_cast<std::size_t>(code)]
                                                                      : "forward";
}

std::vector<std::vector<std::size_t>> gradient_buckets(const std::vector<at::Tensor>& params,
                                                       std::int64_t bucket_bytes) {
  std::vector<std::vector<std::size_t>> buckets;
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!p.requires_grad()) continue;
    const std::int64_t n = p.numel() * static_cast<std::int64_t>(p.element_size());
    if (buckets.empty() || bytes + n > bucket_bytes ||
        params[buckets.back().front()].scalar_type() != p.scalar_type()) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(i);
    bytes += n;
  }
  return buckets;
}

GradientSync::GradientSync(ProcessGroup& pg, const std::vector<at::Tensor>& params, std::int64_t bucket_bytes)
    : pg_(pg), buckets_(gradient_buckets(params, bucket_bytes)) {
  std::int64_t graded = 0;
  for (const auto& bucket : buckets_) {
    numel_.push_back(0);
    for (std::size_t i : bucket) numel_.back() += params[i].numel();
    graded += static_cast<std::int64_t>(bucket.size());
  }
  stats_ = at::zeros({3 + pg_.size() + graded}, at::kDouble);
}

void GradientSync::pack(const std::vector<at::Tensor>& params) {
  if (flat_.empty()) {
    std::vector<at::Tensor> flat;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const auto& first = params[buckets_[b].front()];
      flat.push_back(at::empty({numel_[b]}, first.options().requires_grad(false)));
    }
    flat_ = std::move(flat);  // all or none: a failed allocation leaves none
  }
  double* has = stats_.data_ptr<double>() + 3 + pg_.size();
  std::size_t k = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::int64_t offset = 0;
    for (std::size_t i : buckets_[b]) {
      const auto& p = params[i];
      at::Tensor slot = flat_[b].narrow(0, offset, p.numel());
      if (p.grad().defined()) {
        slot.copy_(p.grad().reshape({-1}));
      } else {
        slot.zero_();
      }
      has[k++] = p.grad().defined() ? 1.0 : 0.0;
      offset += p.numel();
    }
  }
}

GradientSync::Agreed GradientSync::agree(double loss, std::int64_t correct, bool skip, std::int64_t failed_phase) {
  double* s = stats_.data_ptr<double>();
  s[0] = loss;
  s[1] = static_cast<double>(correct);
  s[2] = skip ? 1.0 : 0.0;
  for (std::int64_t r = 0; r < pg_.size(); ++r) s[3 + r] = r == pg_.rank() ? static_cast<double>(failed_phase) : 0.0;
  if (failed_phase != 0) {
    // A rank that failed before packing says nothing about its gradients.
    for (std::int64_t k = 3 + pg_.size(); k < stats_.numel(); ++k) s[k] = 0.0;
  }
  std::vector<at::Tensor> t{stats_};
  pg_.all_reduce_sum(t);
  Agreed a;
  a.loss = s[0];
  a.correct = static_cast<std::int64_t>(std::llround(s[1]));
  a.skip = s[2] > 0;
  for (std::int64_t r = 0; r < pg_.size(); ++r) {
    if (s[3 + r] > 0) {
      a.failed_rank = r;
      a.failed_phase = static_cast<std::int64_t>(std::llround(s[3 + r]));
      break;
    }
  }
  return a;
}

void GradientSync::reduce(double scale) {
  TRAINER_ASSERT(flat_.size() == buckets_.size());
  // Every collective first, then the copies: an allocation that fails in the copies cannot leave
  // the other ranks inside an all-reduce this rank never reaches.
  for (auto& flat : flat_) {
    std::vector<at::Tensor> one{flat};
    pg_.all_reduce_sum(one);
    if (scale != 1.0) flat.mul_(scale);
  }
}

void GradientSync::unpack(const std::vector<at::Tensor>& params) {
  const double* has = stats_.data_ptr<double>() + 3 + pg_.size();
  std::size_t k = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::int64_t offset = 0;
    for (std::size_t i : buckets_[b]) {
      at::Tensor p = params[i];
      const at::Tensor g = flat_[b].narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
      if (has[k++] <= 0) continue;  // no rank has a gradient for it
      if (p.grad().defined()) {
        p.mutable_grad().copy_(g);
      } else {
        p.mutable_grad() = g.clone();
      }
    }
  }
}

std::int64_t GradientSync::bucket_bytes() const {
  std::int64_t n = 0;
  for (const auto& f : flat_) n += static_cast<std::int64_t>(f.nbytes());
  return n;
}

}  // namespace trainer
