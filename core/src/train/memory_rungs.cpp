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

int configured_bits(const std::string& optim_name) {
  if (optim_name == "adamw") return 32;
  if (optim_name == "adamw8bit") return 8;
  return 0;
}

/// A one-element integer tensor of a checkpoint (a file from outside), or nullopt when absent.
std::optional<std::int64_t> read_count(torch::serialize::InputArchive& ar, const std::string& key,
                                       const std::string& file) {
  at::Tensor t;
  if (!ar.try_read(key, t)) return std::nullopt;
  TRAINER_CHECK_T(UsageError, t.numel() == 1 && !at::isFloatingType(t.scalar_type()), "cannot resume from ", file,
                  ": its '", key, "' is not one integer");
  return t.item<std::int64_t>();
}

}  // namespace

MemoryRungs::MemoryRungs(RunParts& parts, RunState& state, Hooks& hooks, spdlog::logger& log)
    : parts_(parts), state_(state), hooks_(hooks), log_(log) {
  for (const auto& b : parts_.model->blocks()) mine_.push_back(!b->wrapped());
  state_.checkpointed_blocks = 0;
  state_.model_blocks = static_cast<std::int64_t>(std::count(mine_.begin(), mine_.end(), true));
  state_.optimizer_moment_bits = detail::moment_bits_of(*parts_.optim);
  const EventContext& ctx = hooks_.context();
  state_.configured_moment_bits =
      ctx.config && ctx.config->has("optim.name") ? configured_bits(ctx.config->get<std::string>("optim.name")) : 0;
  if (state_.optimizer_moment_bits == 0) state_.configured_moment_bits = 0;  // amsgrad: its state stays as it is
}

bool MemoryRungs::apply(const Control& c, const std::string& reason) {
  bool changed = false;
  if (c.checkpointed_blocks) changed |= set_checkpointed_blocks(*c.checkpointed_blocks, reason);
  if (c.optimizer_moment_bits) changed |= set_moment_bits(*c.optimizer_moment_bits, reason);
  return changed;
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
  if (state_.optimizer_moment_bits == 0) {
    log_.warn(
        "optimizer_moment_bits {} ignored: only AdamW's moments change precision (optim.name \"adamw\" or "
        "\"adamw8bit\", without amsgrad){}",
        bits, why);
    return false;
  }
  const int from = state_.optimizer_moment_bits;
  if (bits == from) return false;
  std::int64_t before = 0;
  for (const auto& p : parts_.model->parameters()) {
    for (const auto& t : optimizer_state_of(*parts_.optim, p)) before += static_cast<std::int64_t>(t.nbytes());
  }
  detail::MomentConversion done = detail::with_moment_bits(*parts_.optim, bits);
  // The old optimizer holds no state any more; the new one takes its place everywhere.
  parts_.optim = std::move(done.optimizer);
  ++optimizer_changes_;
  hooks_.context().optimizer = parts_.optim.get();
  attribute_run_memory(nullptr, parts_.optim.get());
  std::int64_t after = 0;
  for (const auto& p : parts_.model->parameters()) {
    for (const auto& t : optimizer_state_of(*parts_.optim, p)) after += static_cast<std::int64_t>(t.nbytes());
  }
  if (!done.error.empty()) {
    log_.warn("optimizer moments {} -> {} bits: stopped after {} of {} parameters ({}); the others keep theirs{}", from,
              bits, done.converted, done.total, done.error, why);
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

std::string MemoryRungs::summary() const {
  std::string out;
  if (state_.checkpointed_blocks > 0) {
    out = fmt::format("{} of {} blocks checkpointed", state_.checkpointed_blocks, state_.model_blocks);
  }
  if (state_.optimizer_moment_bits != state_.configured_moment_bits) {
    out += fmt::format("{}optimizer moments in {} bits", out.empty() ? "" : "; ", state_.optimizer_moment_bits);
  }
  return out;
}

void MemoryRungs::save(torch::serialize::OutputArchive& ar) const {
  if (state_.checkpointed_blocks > 0) ar.write("checkpointed_blocks", at::tensor(state_.checkpointed_blocks));
  if (state_.optimizer_moment_bits != state_.configured_moment_bits) {
    ar.write("optimizer_moment_bits", at::tensor(static_cast<std::int64_t>(state_.optimizer_moment_bits)));
  }
}

void MemoryRungs::restore(torch::serialize::InputArchive& ar, const std::string& file) {
  if (const auto blocks = read_count(ar, "checkpointed_blocks", file)) {
    TRAINER_CHECK_T(UsageError, *blocks >= 0 && *blocks <= state_.model_blocks, "cannot resume from ", file,
                    ": it checkpointed ", *blocks, " blocks; this run's model has ", state_.model_blocks,
                    " blocks the core can checkpoint");
    // Before the position is read: no metric at this run's step 0.
    set_checkpointed_blocks(*blocks, "as when the checkpoint was written", /*metric=*/false);
  }
  if (const auto bits = read_count(ar, "optimizer_moment_bits", file)) {
    TRAINER_CHECK_T(UsageError, *bits == 32 || *bits == 16 || *bits == 8, "cannot resume from ", file,
                    ": its optimizer moments are in ", *bits, " bits; AdamW's are in 32, 16 or 8");
    TRAINER_CHECK_T(UsageError, state_.optimizer_moment_bits > 0, "cannot resume from ", file,
                    ": its AdamW moments are in ", *bits, " bits, and this run's optimizer is not AdamW");
    set_moment_bits(static_cast<int>(*bits), "as when the checkpoint was written", /*metric=*/false);
  }
}

}  // namespace trainer
