#include "dist/grad_sync.h"

#include <ATen/ATen.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <exception>

#include "trainer/distributed.h"
#include "trainer/error.h"

namespace trainer {

std::vector<std::vector<std::size_t>> gradient_buckets(const std::vector<at::Tensor>& params,
                                                       std::int64_t bucket_bytes) {
  constexpr std::int64_t kFirstBucket = 1 << 20;  // DDP's first_bucket_bytes_cap
  std::vector<std::vector<std::size_t>> buckets;
  std::int64_t bytes = 0;
  for (std::size_t i = params.size(); i-- > 0;) {
    const auto& p = params[i];
    if (!p.requires_grad()) continue;
    const std::int64_t n = p.numel() * static_cast<std::int64_t>(p.element_size());
    const std::int64_t cap = buckets.size() == 1 ? std::min(kFirstBucket, bucket_bytes) : bucket_bytes;
    if (buckets.empty() || bytes + n > cap || params[buckets.back().front()].scalar_type() != p.scalar_type()) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(i);
    bytes += n;
  }
  return buckets;
}

struct GradientSync::Hook {
  std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive: the variable holds it weakly
  std::uintptr_t key = 0;
};

GradientSync::GradientSync(ProcessGroup& pg, const std::vector<at::Tensor>& params, std::int64_t bucket_bytes,
                           bool overlap, std::int64_t stats_width)
    : pg_(pg),
      params_(params),
      buckets_(gradient_buckets(params, bucket_bytes)),
      overlap_(overlap),
      stats_width_(stats_width),
      failures_at_(3 + stats_width) {
  std::size_t slots = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    numel_.push_back(0);
    for (std::size_t i : buckets_[b]) {
      numel_.back() += params_[i].numel();
      bucket_of_.push_back(b);
      ++slots;
    }
  }
  stats_ = at::zeros({failures_at_ + pg_.size() + static_cast<std::int64_t>(slots)}, at::kDouble);
  accumulated_.assign(slots, 0);
  reset_attempt();
  if (!overlap_) return;
  std::size_t slot = 0;
  for (const auto& bucket : buckets_) {
    for (std::size_t i : bucket) {
      Hook h;
      h.accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
      TRAINER_ASSERT(h.accumulator);
      h.key = h.accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, slot](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            on_accumulated(slot);
            return outputs;
          }));
      hooks_.push_back(std::move(h));
      ++slot;
    }
  }
}

GradientSync::~GradientSync() {
  for (auto& h : hooks_) h.accumulator->del_post_hook(h.key);
  // A collective still under way (the step failed) writes into buffers it holds itself.
}

void GradientSync::reset_attempt() {
  std::fill(accumulated_.begin(), accumulated_.end(), 0);
  missing_.clear();
  for (const auto& bucket : buckets_) missing_.push_back(static_cast<std::int64_t>(bucket.size()));
  next_ = 0;
  waits_.clear();
  regraded_ = false;
  started_in_backward_ = 0;
  armed_ = false;
}

void GradientSync::arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = overlapping();
}

void GradientSync::on_accumulated(std::size_t slot) {
  if (!armed_) return;  // an earlier micro-batch, evaluation, or no overlap
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  if (accumulated_[slot]) {
    // Accumulated again in the same backward: a started bucket holds an earlier value.
    if (bucket_of_[slot] < next_) regraded_ = true;
    return;
  }
  accumulated_[slot] = 1;
  --missing_[bucket_of_[slot]];
  const std::size_t before = next_;
  start_completed();
  started_in_backward_ += next_ - before;
}

void GradientSync::start_completed() {
  while (next_ < buckets_.size() && missing_[next_] == 0) {
    fill(next_);
    start(next_);
  }
}

void GradientSync::fill(std::size_t b) {
  std::int64_t offset = 0;
  for (std::size_t k = 0; k < buckets_[b].size(); ++k) {
    const auto& p = params_[buckets_[b][k]];
    at::Tensor slot = flat_[b].narrow(0, offset, p.numel());
    if (p.grad().defined()) {
      slot.view(p.sizes()).copy_(p.grad());  // a view of the slot: no temporary for a strided gradient
    } else {
      slot.zero_();
    }
    offset += p.numel();
  }
}

void GradientSync::start(std::size_t b) {
  TRAINER_ASSERT(b == next_);
  std::vector<at::Tensor> one{flat_[b]};
  waits_.push_back(pg_.start_all_reduce_sum(one));
  ++next_;
}

void GradientSync::pack() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  if (flat_.empty()) {
    std::vector<at::Tensor> flat;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const auto& first = params_[buckets_[b].front()];
      flat.push_back(at::empty({numel_[b]}, first.options().requires_grad(false)));
    }
    flat_ = std::move(flat);  // all or none: a failed allocation leaves none
  }
  if (overlapping()) {
    // The buckets the backward did not start, in order (a parameter without a gradient, or
    // one whose hook did not run, holds them back until now).
    for (std::size_t b = next_; b < buckets_.size(); ++b) {
      fill(b);
      start(b);
    }
  } else {
    for (std::size_t b = 0; b < buckets_.size(); ++b) fill(b);
  }
}

void GradientSync::abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  if (!overlapping()) return;  // nothing starts before the agreement
  while (next_ < buckets_.size()) start(next_);
}

GradientSync::Agreed GradientSync::agree(double loss, const std::vector<double>& task_stats, bool skip,
                                         std::int64_t failed_phase) {
  double* s = stats_.data_ptr<double>();
  s[0] = loss;
  s[1] = skip ? 1.0 : 0.0;
  s[2] = regraded_ ? 1.0 : 0.0;
  // A rank that failed (or has no sample) may hold fewer: it adds nothing.
  for (std::int64_t i = 0; i < stats_width_; ++i) {
    s[3 + i] = static_cast<std::size_t>(i) < task_stats.size() ? task_stats[static_cast<std::size_t>(i)] : 0.0;
  }
  double* failures = s + failures_at_;
  for (std::int64_t r = 0; r < pg_.size(); ++r) failures[r] = r == pg_.rank() ? static_cast<double>(failed_phase) : 0.0;
  // Which parameters have a gradient, now that the backward is over (a hook may have run before
  // a later accumulation defined one). A rank that failed says nothing about its gradients.
  double* has = failures + pg_.size();
  std::size_t k = 0;
  for (const auto& bucket : buckets_) {
    for (std::size_t i : bucket) has[k++] = failed_phase == 0 && params_[i].grad().defined() ? 1.0 : 0.0;
  }
  std::vector<at::Tensor> t{stats_};
  pg_.all_reduce_sum(t);
  Agreed a;
  a.loss = s[0];
  a.stats.assign(s + 3, s + 3 + stats_width_);
  a.skip = s[1] > 0;
  regraded_agreed_ = s[2] > 0;
  for (std::int64_t r = 0; r < pg_.size(); ++r) {
    if (failures[r] > 0) {
      a.failed_rank = r;
      a.failed_phase = static_cast<std::int64_t>(std::llround(failures[r]));
      break;
    }
  }
  return a;
}

void GradientSync::wait_started() {
  // Every wait, even after one fails: a bucket is not reused while a collective may write it.
  std::exception_ptr first;
  for (auto& wait : waits_) {
    try {
      wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  reset_attempt();
  if (first) std::rethrow_exception(first);
}

void GradientSync::reduce(double scale) {
  TRAINER_ASSERT(flat_.size() == buckets_.size());
  const std::size_t started = waits_.size();
  wait_started();
  // Every collective first, then the copies: an allocation that fails in the copies cannot leave
  // the other ranks inside an all-reduce this rank never reaches.
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (regraded_agreed_) {
      fill(b);  // a gradient changed after its bucket started: all again, on every rank
    } else if (b < started) {
      continue;
    }
    std::vector<at::Tensor> one{flat_[b]};
    pg_.all_reduce_sum(one);
  }
  if (!established_) established_ = true;  // the buckets exist on every rank: overlap from now on
  if (scale != 1.0) {
    for (auto& flat : flat_) flat.mul_(scale);
  }
}

void GradientSync::unpack() {
  const double* has = stats_.data_ptr<double>() + failures_at_ + pg_.size();
  std::size_t k = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::int64_t offset = 0;
    for (std::size_t i : buckets_[b]) {
      at::Tensor p = params_[i];
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
