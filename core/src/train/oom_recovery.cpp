#include "train/oom_recovery.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/optim/optimizer.h>

#include <algorithm>

#include "train/hooks.h"
#include "train/memory_timeline.h"
#include "trainer/distributed.h"
#include "trainer/optim.h"
#include "util/error_text.h"

namespace trainer {

using detail::error_text;

void drop_gradients(Model& model) {
  for (auto& p : model.parameters()) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

std::string OomRecovery::write_snapshot(const detail::Refusal& refused, const std::exception& e, std::int64_t size,
                                        std::int64_t attempt) {
  MemorySnapshot s;
  s.device = parts_.device.str();
  s.reason = error_text(e);
  s.live = refused.live;
  s.blocks = detail::blocks_of(refused.blocks);
  s.blocks_left_out = refused.blocks_left_out;
  s.requested = refused.requested;
  s.limit = memory_stats(parts_.device).limit;
  s.block_overhead = parts_.device.is_cpu() ? detail::kCpuBlockHeader : 0;
  s.step = state_.global_step;
  s.epoch = state_.epoch;
  s.micro_batch = size;
  s.attempt = attempt;
  s.phase = oom_phase_name(phase_);
  const EventContext& ctx = hooks_.context();
  const std::int64_t keep = ctx.config ? MemorySettings::from(ctx.config->sub("memory")).snapshots : 0;
  return write_oom_snapshot(s, ctx.run_dir, parts_.group ? parts_.group->rank() : 0, keep, log_,
                            refused.allocator_pickle);
}

void OomRecovery::forget_refusal() {
#ifdef TRAINER_WITH_CUDA
  if (parts_.device.is_cuda()) {
    detail::cuda_take_refusal(0);  // one LibTorch caught itself (cuDNN's workspace probes): not this attempt's
    refusal_mark_ = detail::cuda_refusal_mark();
    return;
  }
#endif
  if (!parts_.device.is_cpu()) return;
  detail::cpu_take_refusal();
  refusal_mark_ = detail::cpu_refusal_mark();
}

detail::RefusalPtr OomRecovery::take_refusal() const {
#ifdef TRAINER_WITH_CUDA
  if (parts_.device.is_cuda()) return detail::cuda_take_refusal(refusal_mark_);
#endif
  // This thread's refusal, or one another thread made since the attempt began (an error an
  // intra-op worker threw and the step rethrew).
  if (parts_.device.is_cpu()) return detail::cpu_take_refusal(refusal_mark_);
  return nullptr;
}

Control OomRecovery::report(const std::exception& e, std::int64_t size, std::int64_t samples, std::int64_t attempt,
                            bool force_clear) {
  clear_memory(parts_.device, force_clear);
  ++state_.oom_recoveries;
  OomInfo info;
  info.phase = phase_;
  info.message = error_text(e);
  info.micro_batch_size = size;
  info.batch_size = samples;
  info.attempt = attempt;
  info.micro_batch_helps = oom_phase_info(phase_).micro_batch_helps;
  info.stats = has_memory_backend(parts_.device) ? memory_stats(parts_.device) : MemoryStats{};
  info.requested_bytes = info.stats.last_failed_request;
  info.live = live_;
  // One point per out-of-memory error, for every sink (MLflow, the report's memory plot).
  if (auto* m = hooks_.context().metrics) m->log(state_.global_step, {{"oom/micro_batch_size", double(size)}});
  return hooks_.fire(Event::OutOfMemory, EventArgs::out_of_memory(info));
}

std::int64_t OomRecovery::recover(const std::exception& e, OomRetry rule, std::int64_t micro, std::int64_t samples,
                                  std::int64_t attempt, std::vector<std::int64_t>& tried, ProcessGroup* ranks) {
  live_.reset();
  std::string seen;  // "; live then: …; snapshot …" for the warning
  if (const detail::RefusalPtr refused = take_refusal()) {
    live_ = refused->live;
    // Telling what was live is never worth the recovery: without memory even for that, the
    // warning goes without it.
    try {
      seen = "; live then: " + largest_category_text(refused->live);
      const std::string file = write_snapshot(*refused, e, rule == OomRetry::Once ? 0 : micro, attempt);
      if (!file.empty()) seen += "; snapshot " + file;
    } catch (const std::exception& error) {
      log_.warn("the out-of-memory snapshot was not written: {}", error.what());
    }
  }
  if (rule == OomRetry::Once) {
    // The plugins hear of it, but a checkpoint has no size to change: the core retries it once
    // after freeing every cached block.
    report(e, 0, 0, attempt, /*force_clear=*/true);
    if (attempt >= 1) throw OomFailure("out of memory while writing it twice: " + error_text(e), phase_);
    log_.warn("out of memory while writing a checkpoint{}; retrying once after freeing memory", seen);
    return micro;
  }
  drop_gradients(*parts_.model);
  tried.push_back(micro);
  const OomPhase phase = phase_;
  const std::string message = error_text(e);
  log_.warn("out of memory in {} (micro-batch {}, attempt {}): {}{}", oom_phase_name(phase), micro, attempt + 1,
            message, seen);
  const Control c = report(e, micro, samples, attempt, /*force_clear=*/false);
  // Memory savers asked for (oom_backoff's ladder): -1 / 0 when not.
  std::int64_t blocks = c.checkpointed_blocks.value_or(-1);
  int bits = c.optimizer_moment_bits.value_or(0);
  int offload = c.optimizer_offload ? (*c.optimizer_offload ? 2 : 1) : 0;  // 0: not asked, 1: off, 2: on
  bool again = (c.switch_device || c.retry_with_micro_batch || blocks >= 0 || bits > 0 || offload > 0) &&
               attempt + 1 < kMaxAttempts;
  std::int64_t next = std::clamp<std::int64_t>(c.retry_with_micro_batch.value_or(micro), 1, samples);
  std::string why_not;
  if (parts_.group && c.switch_device) {
    // A rank cannot move alone to another device (its gradients' buckets and collectives stay
    // where the group is), in training or in an evaluation.
    again = false;
    why_not = " (a data-parallel run cannot move one rank to another device: " + *c.switch_device + " was asked)";
  }
  if (ranks) {
    // Every rank heard of the same failure; they retry together with the smallest size asked, the
    // most blocks checkpointed, the fewest moment bits and the offload any rank asks (replicas
    // stay alike), or all give up.
    const auto agreed = ranks->all_reduce_max({again ? 0 : 1, -next, blocks, bits > 0 ? 64 - bits : 0, offload});
    if (again && agreed[0] != 0) why_not = " (another rank's plugins gave up)";
    again = agreed[0] == 0;
    next = -agreed[1];
    blocks = agreed[2];
    bits = agreed[3] > 0 ? static_cast<int>(64 - agreed[3]) : 0;
    offload = static_cast<int>(agreed[4]);
  }
  if (again) {
    std::string where;
    if (c.switch_device) {
      const c10::Device from = parts_.device;
      move_run_to(c10::Device(*c.switch_device), c.reason);
      if (parts_.device != from) moves_.push_back(from.str() + " -> " + parts_.device.str());
      where = " on " + parts_.device.str();
    }
    Control savers;
    if (blocks >= 0) savers.checkpointed_blocks = blocks;
    if (bits > 0) savers.optimizer_moment_bits = bits;
    if (offload > 0) savers.optimizer_offload = offload == 2;
    rungs_.apply(savers, c.reason);
    const std::string on = rungs_.summary();
    log_.warn("retrying the same {}{} with micro-batches of {} ({}{}){}",
              phase == OomPhase::Eval ? "evaluation" : "batch", where, next,
              next < micro ? "smaller" : "same size or larger", on.empty() ? "" : "; " + on,
              c.reason.empty() ? "" : ": " + c.reason);
    return next;
  }
  std::string sizes;
  for (auto t : tried) sizes += (sizes.empty() ? "" : " -> ") + std::to_string(t);
  const std::string why =
      !why_not.empty()           ? why_not
      : c.retry_with_micro_batch ? " (retry limit reached)"
      : oom_phase_info(phase).micro_batch_helps
          ? " (no plugin asked for another retry; oom_backoff retries down to its min_micro_batch)"
          : " (a smaller micro-batch cannot help in this phase; oom_backoff retries once at the same size, then moves "
            "to its fallback_devices)";
  // What the plugins said when they asked for nothing (oom_backoff: which rungs were left, and advice).
  const std::string said = again || c.reason.empty() ? std::string() : " [" + c.reason + "]";
  std::string msg = message;
  while (!msg.empty() && (msg.back() == '.' || msg.back() == '\n')) msg.pop_back();
  const std::string moves = fmt::to_string(fmt::join(moves_, ", "));
  const std::string on = rungs_.summary();
  throw OomFailure(
      fmt::format("out of memory in {} on {} after {} attempt(s) with micro-batches {}{}{}{}{}: {}. What to change: {}",
                  oom_phase_name(phase), parts_.device.str(), tried.size(), sizes,
                  moves.empty() ? "" : " (device fallback: " + moves + ")", on.empty() ? "" : " (with " + on + ")", why,
                  said, msg, oom_advice(phase)),
      phase, tried.empty() ? 0 : tried.back());
}

void OomRecovery::move_run_to(const c10::Device& to, const std::string& reason) {
  // Parameters and buffers move in place (Module::to keeps each tensor's identity, so the
  // optimizer's references and state keys stay valid), then the optimizer state one tensor at
  // a time, so nothing exists twice but the tensor being copied. Gradients are undefined here:
  // the failed attempt was dropped.
  if (to == parts_.device) {
    log_.warn("switch_device {}: the run is already there{}", to.str(), reason.empty() ? "" : " (" + reason + ")");
    return;
  }
  if (to.is_cuda()) check_cuda_device(to, "switch_device");
  const c10::Device from = parts_.device;
  std::int64_t param_bytes = 0;
  for (const auto& p : parts_.model->parameters()) param_bytes += static_cast<std::int64_t>(p.nbytes());
  for (const auto& b : parts_.model->buffers()) param_bytes += static_cast<std::int64_t>(b.nbytes());
  drop_gradients(*parts_.model);
  parts_.model->to(to);
  const std::int64_t state_bytes = move_optimizer_state(*parts_.optim, to);
  parts_.device = to;
  hooks_.context().device = to;
  clear_memory(from, /*force=*/true);
  log_.warn("moved the run from {} to {}: {} of parameters and buffers, {} of optimizer state{}", from.str(), to.str(),
            format_bytes(param_bytes), format_bytes(state_bytes), reason.empty() ? "" : " (" + reason + ")");
  hooks_.fire(Event::ModelToDevice);
}

}  // namespace trainer
