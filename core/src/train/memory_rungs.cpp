#include "train/memory_rungs.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <algorithm>

#include "optim/adamw8bit.h"
#include "train/hooks.h"
#include "train/memory_timeline.h"
#include "train/setup.h"
#include "trainer/activation_checkpoint.h"
#include "trainer/context.h"
#include "trainer/control.h"
#include "trainer/error.h"
#include "trainer/memory.h"
#include "trainer/metrics.h"
#include "trainer/optim.h"

namespace trainer {

namespace {

/// A one-element integer tensor of a checkpoint (a file from outside), or nullopt when absent.
std::optional<std::int64_t> read_count(torch::serialize::InputArchive& ar, const std::string& key,
                                       const std::string& file) {
  at::Tensor t;
  if (!ar.try_read(key, t)) return std::nullopt;
  TRAINER_CHECK_T(UsageError, t.numel() == 1 && at::isIntegralType(t.scalar_type(), /*includeBool=*/false),
                  "cannot resume from ", file, ": its '", key, "' is not one integer");
  return t.item<std::int64_t>();
}

}  // namespace

MemoryRungs::MemoryRungs(RunParts& parts, RunState& state, Hooks& hooks, spdlog::logger& log)
    : parts_(parts), state_(state), hooks_(hooks), log_(log) {
  for (const auto& b : parts_.model->blocks()) mine_.push_back(!b->wrapped());
  state_.checkpointed_blocks = 0;
  state_.model_blocks = static_cast<std::int64_t>(std::count(mine_.begin(), mine_.end(), true));
  // The optimizer as built: its bits are the configured ones. A data-parallel run keeps them: a
  // conversion that ran out of memory on one rank only would leave the replicas' states unlike.
  state_.optimizer_moment_bits = parts_.group ? 0 : detail::moment_bits_of(*parts_.optim);
  state_.configured_moment_bits = state_.optimizer_moment_bits;
  state_.optimizer_offload = detail::offloaded(*parts_.optim);
}

bool MemoryRungs::apply(const Control& c, const std::string& reason) {
  bool changed = false;
  if (c.checkpointed_blocks) changed |= set_checkpointed_blocks(*c.checkpointed_blocks, reason);
  if (c.optimizer_moment_bits) changed |= set_moment_bits(*c.optimizer_moment_bits, reason);
  if (c.optimizer_offload) changed |= set_offload(*c.optimizer_offload, reason);
  return changed;
}

std::int64_t MemoryRungs::state_bytes(bool device_only) const {
  return optimizer_state_bytes(*parts_.optim, parts_.model->parameters(), device_only);
}

bool MemoryRungs::without_adamw_moments(const std::string& request, const char* kept_in_data_parallel, const char* only,
                                        const std::string& why) const {
  if (state_.optimizer_moment_bits != 0) return false;
  log_.warn("{} ignored: {}{}", request,
            parts_.group
                ? kept_in_data_parallel
                : fmt::format("only AdamW's moments {} (optim.name \"adamw\" or \"adamw8bit\", without amsgrad)", only),
            why);
  return true;
}

void MemoryRungs::replace_optimizer(std::unique_ptr<torch::optim::Optimizer> made) {
  // The old optimizer holds no state any more; the new one takes its place everywhere.
  parts_.optim = std::move(made);
  ++optimizer_changes_;
  hooks_.context().optimizer = parts_.optim.get();
  attribute_run_memory(nullptr, parts_.optim.get());
}

bool MemoryRungs::set_checkpointed_blocks(std::int64_t blocks, const std::string& reason, bool metric) {
  const std::string why = reason.empty() ? "" : " (" + reason + ")";
  if (state_.model_blocks == 0) {
    log_.warn("checkpointed_blocks {} ignored: the model has no blocks the core can checkpoint{}{}", blocks,
              mine_.empty() ? " (Model::blocks() is empty)" : " (a plugin wraps all of them)", why);
    return false;
  }
  const std::int64_t want = std::clamp<std::int64_t>(blocks, 0, state_.model_blocks);
  if (want == state_.checkpointed_blocks) return false;
  const auto all = parts_.model->blocks();
  TRAINER_CHECK(all.size() == mine_.size(), "the model's blocks changed during the run (", mine_.size(), " then, ",
                all.size(), " now)");
  std::int64_t wrapped = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!mine_[i]) continue;
    if (wrapped < want) {
      all[i]->set_wrapper([](Block& b, const at::Tensor& x) { return checkpoint_block(b, x); });
      ++wrapped;
    } else {
      all[i]->set_wrapper({});
    }
  }
  log_.warn("activation checkpointing: {} -> {} of {} blocks checkpointed (the first in forward order){}",
            state_.checkpointed_blocks, want, state_.model_blocks, why);
  state_.checkpointed_blocks = want;
  if (auto* m = hooks_.context().metrics; m && metric) {
    m->log(state_.global_step, {{"memory/checkpointed_blocks", double(want)}});
  }
  return true;
}

bool MemoryRungs::set_moment_bits(int bits, const std::string& reason, bool metric) {
  const std::string why = reason.empty() ? "" : " (" + reason + ")";
  if (bits != 32 && bits != 16 && bits != 8) {
    log_.warn("optimizer_moment_bits {} ignored: AdamW's moments are kept in 32, 16 or 8 bits{}", bits, why);
    return false;
  }
  if (without_adamw_moments(fmt::format("optimizer_moment_bits {}", bits),
                            "a data-parallel run keeps its moments' bits", "change precision", why)) {
    return false;
  }
  const int from = state_.optimizer_moment_bits;
  if (bits == from) return false;
  const std::int64_t before = state_bytes(false);
  detail::MomentConversion done = detail::with_moment_bits(*parts_.optim, bits);
  replace_optimizer(std::move(done.optimizer));
  const std::int64_t after = state_bytes(false);
  if (!done.error.empty()) {
    log_.warn(
        "optimizer moments {} -> {} bits: stopped after {} of {} parameters ({}); the moments stay in {} bits{}{}",
        from, bits, done.converted, done.total, done.error, from,
        bits < from ? " (the next request converts the rest)" : " (those converted went back)", why);
  }
  if (done.bits != from) {
    log_.warn("optimizer moments: {} -> {} bits, optimizer state {} -> {}{}{}", from, done.bits, format_bytes(before),
              format_bytes(after), done.bits < 32 ? " (not exact: the moments lose precision)" : "", why);
  }
  state_.optimizer_moment_bits = done.bits;
  if (auto* m = hooks_.context().metrics; m && metric && done.bits != from) {
    m->log(state_.global_step, {{"memory/optimizer_moment_bits", double(done.bits)}});
  }
  return done.bits != from;
}

bool MemoryRungs::set_offload(bool on, const std::string& reason, bool metric) {
  const std::string why = reason.empty() ? "" : " (" + reason + ")";
  if (without_adamw_moments(fmt::format("optimizer_offload {}", on),
                            "a data-parallel run keeps its optimizer state where it is", "move to host memory", why)) {
    return false;
  }
  // Offloaded with moments still on the GPU (a way back that ran out of memory part-way): a
  // request to offload moves those.
  const bool partly = on && state_.optimizer_offload && !parts_.device.is_cpu() && state_bytes(true) > 0;
  if (on == state_.optimizer_offload && !partly) return false;
  const std::int64_t before = state_bytes(true);
  detail::MomentConversion done;
  try {
    done = detail::with_offload(*parts_.optim, on);
  } catch (const Error& e) {  // what the optimizer's parameters cannot do (nothing moved)
    log_.warn("optimizer_offload {} ignored: {}{}", on, e.what(), why);
    return false;
  }
  replace_optimizer(std::move(done.optimizer));
  const std::int64_t after = state_bytes(true);
  const std::string device = parts_.device.str();
  if (!done.error.empty()) {
    log_.warn("optimizer moments {} host memory: stopped after {} of {} parameters ({}){}", on ? "to" : "from",
              done.converted, done.total, done.error, why);
  }
  const bool changed = done.offload != state_.optimizer_offload || (partly && after < before);
  if (changed) {
    log_.warn("optimizer moments: {}, optimizer state on {} {} -> {} (exact{}){}",
              done.offload ? "offloaded to host memory, streamed through each step" : "back on the device", device,
              format_bytes(before), format_bytes(after),
              parts_.device.is_cpu() ? "; on the CPU host memory is the device's: nothing moved" : "", why);
  }
  state_.optimizer_offload = done.offload;
  if (auto* m = hooks_.context().metrics; m && metric && changed) {
    m->log(state_.global_step, {{"memory/optimizer_offload", done.offload ? 1.0 : 0.0}});
  }
  return changed;
}

std::string MemoryRungs::summary() const {
  std::string out;
  if (state_.checkpointed_blocks > 0) {
    out = fmt::format("{} of {} blocks checkpointed", state_.checkpointed_blocks, state_.model_blocks);
  }
  if (state_.optimizer_moment_bits != state_.configured_moment_bits) {
    out += fmt::format("{}optimizer moments in {} bits", out.empty() ? "" : "; ", state_.optimizer_moment_bits);
  }
  if (state_.optimizer_offload) out += fmt::format("{}optimizer moments in host memory", out.empty() ? "" : "; ");
  return out;
}

void MemoryRungs::save(torch::serialize::OutputArchive& ar) const {
  if (state_.checkpointed_blocks > 0) ar.write("checkpointed_blocks", at::tensor(state_.checkpointed_blocks));
  // The form the optimizer's state is saved in (whatever optim.name says), so that a resume
  // reads it into an optimizer of that form.
  const int bits = detail::moment_bits_of(*parts_.optim);
  if (bits > 0) ar.write("optimizer_moment_bits", at::tensor(static_cast<std::int64_t>(bits)));
  if (detail::offloaded(*parts_.optim)) ar.write("optimizer_offload", at::tensor(static_cast<std::int64_t>(1)));
}

void MemoryRungs::restore(torch::serialize::InputArchive& ar, const std::string& file) {
  // Before the position is read: no metrics at this run's step 0.
  if (const auto blocks = read_count(ar, "checkpointed_blocks", file)) {
    TRAINER_CHECK_T(UsageError, *blocks >= 0, "cannot resume from ", file, ": it checkpointed ", *blocks, " blocks");
    if (*blocks > state_.model_blocks) {
      // Checkpointing is exact: fewer blocks to wrap (a plugin wraps some now) change no result.
      log_.warn("{} checkpointed {} blocks; this run's model has {} the core can checkpoint: all of those", file,
                *blocks, state_.model_blocks);
    }
    if (state_.model_blocks > 0) {
      set_checkpointed_blocks(std::min(*blocks, state_.model_blocks), "as when the checkpoint was written",
                              /*metric=*/false);
    }
  }
  if (const auto bits = read_count(ar, "optimizer_moment_bits", file)) {
    TRAINER_CHECK_T(UsageError, *bits == 32 || *bits == 16 || *bits == 8, "cannot resume from ", file,
                    ": its optimizer moments are in ", *bits, " bits; AdamW's are in 32, 16 or 8");
    const int have = detail::moment_bits_of(*parts_.optim);
    TRAINER_CHECK_T(UsageError, have > 0, "cannot resume from ", file, ": its AdamW moments are in ", *bits,
                    " bits, and this run's optimizer is not AdamW (without amsgrad)");
    if (have != *bits) {
      // The optimizer has no state yet: it is rebuilt in the file's form, whatever optim.name says
      // (a data-parallel run too: every rank reads the same file).
      const int shown = state_.optimizer_moment_bits;
      state_.optimizer_moment_bits = have;
      set_moment_bits(static_cast<int>(*bits), "as when the checkpoint was written", /*metric=*/false);
      if (parts_.group) state_.optimizer_moment_bits = shown;
    }
    // Its state may hold a mix of forms (bits that changed part-way): each is read as it is.
    if (auto* compact = dynamic_cast<detail::AdamW8bit*>(parts_.optim.get())) compact->accept_mixed_forms(true);
  }
  if (const auto offload = read_count(ar, "optimizer_offload", file)) {
    TRAINER_CHECK_T(UsageError, *offload == 0 || *offload == 1, "cannot resume from ", file,
                    ": its 'optimizer_offload' is ", *offload, "; it is 1 (the moments in host memory) or absent");
    TRAINER_CHECK_T(UsageError, *offload == 0 || detail::moment_bits_of(*parts_.optim) > 0, "cannot resume from ", file,
                    ": its AdamW moments are in host memory, and this run's optimizer is not AdamW");
    // As the bits: the optimizer (no state yet) reads the file's moments into host memory.
    if (*offload == 1) {
      const int shown = state_.optimizer_moment_bits;
      state_.optimizer_moment_bits = detail::moment_bits_of(*parts_.optim);
      set_offload(true, "as when the checkpoint was written", /*metric=*/false);
      if (auto* compact = dynamic_cast<detail::AdamW8bit*>(parts_.optim.get())) compact->accept_mixed_forms(true);
      if (parts_.group) state_.optimizer_moment_bits = shown;
    }
  }
}

}  // namespace trainer
