// oom_backoff: the policy half of OOM recovery. The core drops a failed attempt and fires
// OutOfMemory; this plugin answers by climbing a ladder of memory savers, chosen by what was
// full: a smaller micro-batch (the core re-runs the same samples as more micro-batches),
// activation checkpointing of more and more blocks, AdamW's moments in bf16 then 8 bits (not
// exact: only with allow_inexact), AdamW's moments in host memory (a GPU), another device.
// After enough clean steps it climbs down in reverse order (the moments back on the device,
// back to their bits, then checkpointing, then the micro-batch grows back toward the
// configured size), remembering where it failed so it does not thrash. Where nothing on the
// ladder changes the memory needed (reading the batch) it retries once at the same size, then
// falls back to another device or gives up. What it learnt (the micro-batch, the ceiling, the
// patience) is saved in each checkpoint, and the core keeps the savers that are on: a resumed
// run starts where this one was instead of running out of memory again.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "oom_backoff_ladder.h"
#include "oom_backoff_settings.h"
#include "trainer/core_settings.h"
#include "trainer/memory.h"
#include "trainer/metrics.h"
#include "trainer/plugin.h"

namespace trainer::oom_backoff {

namespace {

class OomBackoffPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "oom_backoff"; }
  std::string description() const override {
    return "On out-of-memory, climb a ladder of memory savers (smaller micro-batch, activation checkpointing, "
           "compact optimizer state, another device) and climb back down after clean steps";
  }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::Resume, E::FitStart, E::BatchStart, E::AfterOptimizerStep, E::OutOfMemory, E::FitEnd};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return OomBackoffSettings::keys(); }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = OomBackoffSettings::from(section);
    order_ = configured_ladder(s_, section.origin("ladder"));
    check_settings(s_, section);
  }

  /// The counters a resume restores as they were, each named once.
  trainer::StateFields counters() {
    return trainer::StateFields()
        .add("good", good_)
        .add("bad", bad_)
        .add("clean_steps", clean_steps_)
        .add("ooms", ooms_);
  }
  void save_state(trainer::PluginState& state) override {
    counters().save(state);
    // Not applied yet (a resumed run that checkpoints before its first batch): what was restored.
    state.set_int("micro_batch", restored_micro_ > 0 ? restored_micro_ : current_);
    state.set_int("configured", configured_);
    state.set_int("grow_after", s_.grow_after);
    state.set_int("patience", patience_);
  }
  void load_state(const trainer::PluginState& state) override {
    counters().load(state);
    // Applied at Resume, against this run's settings.
    restored_micro_ = state.get_int("micro_batch");
    restored_configured_ = state.get_int("configured");
    // The patience grows after failed grows; a changed grow_after setting starts it afresh.
    patience_ = state.get_int("grow_after", s_.grow_after) == s_.grow_after ? state.get_int("patience", s_.grow_after)
                                                                            : s_.grow_after;
    restored_ = true;
  }

  void on_event(trainer::EventContext& ctx, trainer::Control& control) override {
    switch (ctx.event) {
      case trainer::Event::Resume:
        if (restored_ && restored_micro_ > 0) {
          logger_->info("oom_backoff: restored micro-batch {} (ceiling {}, {} clean steps of {} before growing){}",
                        restored_micro_, bad_ > 0 ? std::to_string(bad_) : std::string("none"), clean_steps_, patience_,
                        savers_text(ctx.state).empty() ? "" : "; on: " + savers_text(ctx.state));
        }
        break;
      case trainer::Event::FitStart: {
        configured_ = trainer::TrainingSettings::from(ctx.config->sub("training")).micro_batch();
        current_ = configured_;
        if (!restored_) patience_ = s_.grow_after;
        // What the model or the optimizer cannot do ends the run as a usage error (exit code 2)
        // before its first step, whatever this plugin's failure policy.
        check_start_savers(s_, ctx.state, ctx.device);
        if (restored_configured_ != 0 && restored_configured_ != configured_) {
          // What was learnt for another configured size still says what fits; sizes above the
          // new configured one are not used.
          restored_micro_ = std::min(restored_micro_, configured_);
        }
        break;
      }
      case trainer::Event::AfterOptimizerStep: {
        const std::int64_t cur = ctx.state.micro_batch_size;
        if ((asked_bits_ > 0 && ctx.state.optimizer_moment_bits != asked_bits_) ||
            (asked_onto_device_ && ctx.state.optimizer_offload)) {
          // The moments' way back ran out of memory converting or moving (the core kept them as
          // they were): as a grow that failed, wait twice as long before the next try.
          patience_ = std::max<std::int64_t>(patience_ * 2, s_.grow_after);
          grew_ = false;
        }
        if (asked_onto_device_ && ctx.state.optimizer_offload) partly_offloaded_ = true;
        asked_bits_ = 0;
        asked_onto_device_ = false;
        asked_offload_ = false;
        good_ = std::max(good_, cur);
        if (bad_ > 0 && cur >= bad_) bad_ = 0;  // the ceiling was stale: memory freed up
        if (grew_) patience_ = s_.grow_after;   // a grow (or an undone saver) that worked resets the patience
        grew_ = false;
        ++clean_steps_;
        log_rung(ctx);
        break;
      }
      case trainer::Event::BatchStart:
        current_ = ctx.state.micro_batch_size;
        if (!started_) {
          // The savers to start with. A resumed run (this plugin's state restored, or steps
          // already trained: a checkpoint written without this plugin) has the core's, as the
          // checkpoint recorded them.
          started_ = true;
          const bool fresh = !restored_ && ctx.state.global_step == 0;
          bool set = false;
          if (fresh && s_.start_checkpointed_blocks > 0) {
            control.checkpointed_blocks = s_.start_checkpointed_blocks;
            set = true;
          }
          if (fresh && s_.start_moment_bits > 0) {
            control.optimizer_moment_bits = static_cast<int>(s_.start_moment_bits);
            set = true;
          }
          if (fresh && s_.start_offload) {
            control.optimizer_offload = true;
            set = true;
          }
          if (set) control.reason = "started on the ladder (plugins.oom_backoff.start_*)";
        }
        if (restored_micro_ > 0) {
          // The first batch after a resume: the micro-batch that worked before the checkpoint.
          if (restored_micro_ < current_) {
            control.micro_batch_size = restored_micro_;
            control.reason =
                "resuming at micro-batch " + std::to_string(restored_micro_) + ", learnt before the checkpoint";
            current_ = restored_micro_;
          }
          restored_micro_ = 0;
          break;
        }
        maybe_climb_down(ctx, control);
        if (control.micro_batch_size) current_ = *control.micro_batch_size;
        break;
      case trainer::Event::OutOfMemory:
        on_oom(ctx, control);
        break;
      case trainer::Event::FitEnd:
        if (ooms_ > 0) {
          const std::string on = savers_text(ctx.state);
          logger_->info("oom_backoff: {} out-of-memory error(s) recovered; micro-batch now {} (configured {}){}", ooms_,
                        ctx.state.micro_batch_size, configured_, on.empty() ? "" : "; still on: " + on);
        }
        break;
      default:
        break;
    }
  }

 private:
  /// The highest rung on (1-based in the default order; 0: none), as the metric memory/rung.
  int rung_now(const trainer::EventContext& ctx) const {
    if (moved_) return 1 + static_cast<int>(Rung::Device);
    const auto& st = ctx.state;
    if (st.optimizer_offload) return 1 + static_cast<int>(Rung::Offload);
    if (st.optimizer_moment_bits != st.configured_moment_bits) {
      return 1 + static_cast<int>(st.optimizer_moment_bits <= 8 ? Rung::Optimizer8bit : Rung::OptimizerBf16);
    }
    if (st.checkpointed_blocks > 0) return 1 + static_cast<int>(Rung::Checkpoint);
    if (current_ > 0 && current_ < configured_) return 1 + static_cast<int>(Rung::MicroBatch);
    return 0;
  }
  void log_rung(const trainer::EventContext& ctx) {
    const int now = rung_now(ctx);
    if (now == logged_rung_ || !ctx.metrics) return;
    ctx.metrics->log(ctx.state.global_step, {{"memory/rung", double(now)}});
    logged_rung_ = now;
  }

  void on_oom(trainer::EventContext& ctx, trainer::Control& control) {
    const trainer::OomInfo& oom = *ctx.oom;
    ++ooms_;
    // The moments' way back that left some in host memory, or an offload the core refused (the
    // parameters' dtype): the rung applies again, or never.
    if (asked_onto_device_ && ctx.state.optimizer_offload) partly_offloaded_ = true;
    if (asked_offload_ && !ctx.state.optimizer_offload) offload_refused_ = true;
    asked_bits_ = 0;  // a failure after asking counts as one below (grew_)
    asked_onto_device_ = false;
    asked_offload_ = false;
    if (oom.phase == trainer::OomPhase::Checkpoint) return;  // the core retries a checkpoint once by itself
    const bool eval = oom.phase == trainer::OomPhase::Eval;
    if (eval && !s_.eval) return;
    if (oom.attempt == 0) retries_base_ = 0;  // a new batch (or evaluation)
    if (eval) {
      eval_back_off(ctx, oom, control);
      return;
    }
    if (oom.attempt - retries_base_ >= s_.max_retries) {
      if (fall_back(ctx, control, oom, false)) return;
      logger_->error("oom_backoff: giving up on this batch after {} retries (plugins.oom_backoff.max_retries)",
                     oom.attempt - retries_base_);
      return;
    }
    // A failure right after growing (or undoing a saver) means that did not fit (yet): wait
    // twice as long before the next attempt instead of failing every few steps. Reading the
    // batch and a rank group's all-reduce say nothing about what fits.
    if (oom.phase != trainer::OomPhase::Data && oom.phase != trainer::OomPhase::AllReduce) {
      if (grew_) patience_ = std::max<std::int64_t>(patience_ * 2, s_.grow_after);
      grew_ = false;
      clean_steps_ = 0;
    }
    if (oom.micro_batch_helps) {
      bad_ = bad_ > 0 ? std::min(bad_, oom.micro_batch_size) : oom.micro_batch_size;  // smallest known not to fit
      if (oom.micro_batch_size <= good_) good_ = 0;  // a size that fitted no longer does
    } else if (oom.phase == trainer::OomPhase::Data || oom.phase == trainer::OomPhase::AllReduce ||
               (!s_.allow_inexact && !offload_applies(ctx, oom))) {
      // Nothing on the ladder but another device changes this memory (or only inexact rungs
      // would): retry once at the same size (the core freed its cached memory) first.
      if (oom.attempt - retries_base_ == 0) {
        control.retry_with_micro_batch = oom.micro_batch_size;
        control.reason = std::string("out of memory in ") + trainer::oom_phase_name(oom.phase) +
                         ", which the micro-batch does not change; retrying once after freeing cached memory";
        return;
      }
    }
    std::string skipped;  // rungs that would apply but may not, for the advice
    for (const Rung r : ladder(order_, oom, ctx.device)) {
      if (take(r, ctx, control, oom, skipped)) {
        logger_->warn("oom_backoff: rung {}: out of memory in {}{}; {}", rung_name(r),
                      trainer::oom_phase_name(oom.phase),
                      oom.live ? " with " + trainer::largest_category_text(*oom.live) : std::string(), control.reason);
        return;
      }
    }
    control.reason = "the ladder (" + ladder_text(order_, oom, ctx.device) +
                     ") has no rung left for out of memory in " + trainer::oom_phase_name(oom.phase) + skipped;
    logger_->error("oom_backoff: {}", control.reason);
  }

  /// Takes rung `r` if it applies here and is not used up: sets what the core is to do and why.
  bool take(Rung r, const trainer::EventContext& ctx, trainer::Control& control, const trainer::OomInfo& oom,
            std::string& skipped) {
    const trainer::RunState& st = ctx.state;
    const std::int64_t cur = oom.micro_batch_size;
    const bool training_memory = oom.phase != trainer::OomPhase::Data && oom.phase != trainer::OomPhase::AllReduce;
    switch (r) {
      case Rung::MicroBatch: {
        if (!oom.micro_batch_helps) return false;
        std::int64_t next =
            std::max<std::int64_t>(s_.min_micro_batch, static_cast<std::int64_t>(double(cur) * s_.factor));
        if (good_ > next && good_ < cur) next = good_;  // back to the largest size known to fit
        if (next >= cur) return false;
        control.retry_with_micro_batch = next;
        control.reason = std::to_string(cur) + " did not fit";
        current_ = next;
        return true;
      }
      case Rung::Checkpoint: {
        // Activations are what checkpointing saves: those of the forward and backward.
        if (!oom.micro_batch_helps || st.model_blocks == 0 || st.checkpointed_blocks >= st.model_blocks) return false;
        const std::int64_t next = st.checkpointed_blocks == 0 ? std::max<std::int64_t>(1, (st.model_blocks + 3) / 4)
                                                              : std::min(st.model_blocks, 2 * st.checkpointed_blocks);
        control.checkpointed_blocks = next;
        control.retry_with_micro_batch = cur;
        control.reason = "checkpointing " + std::to_string(next) + " of " + std::to_string(st.model_blocks) +
                         " blocks at micro-batch " + std::to_string(cur) + " (exact)";
        return true;
      }
      case Rung::OptimizerBf16:
      case Rung::Optimizer8bit: {
        const int bits = r == Rung::OptimizerBf16 ? 16 : 8;
        if (!training_memory || st.optimizer_moment_bits <= bits) return false;  // not AdamW (0), or already there
        if (!s_.allow_inexact) {
          if (skipped.find("allow_inexact") == std::string::npos) {
            skipped += "; AdamW's moments in " + std::to_string(bits) +
                       " bits would save optimizer state but change results: set plugins.oom_backoff.allow_inexact "
                       "= true to allow it, or start with optim.name = \"adamw8bit\"";
          }
          return false;
        }
        control.optimizer_moment_bits = bits;
        control.retry_with_micro_batch = cur;
        control.reason = "AdamW's moments in " + std::to_string(bits) +
                         " bits (inexact: " + "plugins.oom_backoff.allow_inexact = true)";
        return true;
      }
      case Rung::Offload:
        if (ctx.device.is_cpu()) {
          if (!offload_noted_) {
            logger_->info("oom_backoff: rung offload skipped: the run is on the CPU, whose memory is the host's");
            offload_noted_ = true;
          }
          return false;
        }
        // AdamW's (0 bits: another optimizer, or a data-parallel run), not in host memory yet
        // (or partly, after a way back that ran out of memory), and not refused by the core.
        if (!training_memory || !offload_applies(ctx, oom, /*in_ladder=*/false)) return false;
        control.optimizer_offload = true;
        asked_offload_ = true;
        partly_offloaded_ = false;
        control.retry_with_micro_batch = cur;
        control.reason = "AdamW's moments in host memory, streamed through each optimizer step (exact)";
        return true;
      case Rung::Device:
        return fall_back(ctx, control, oom, false);
    }
    return false;
  }

  /// Whether the offload rung would move AdamW's moments now: on a GPU, AdamW outside a
  /// data-parallel run, not all in host memory yet, not refused before, and (`in_ladder`) on
  /// this error's ladder.
  bool offload_applies(const trainer::EventContext& ctx, const trainer::OomInfo& oom, bool in_ladder = true) const {
    const trainer::RunState& st = ctx.state;
    if (ctx.device.is_cpu() || st.optimizer_moment_bits == 0 || offload_refused_) return false;
    if (st.optimizer_offload && !partly_offloaded_) return false;
    if (!in_ladder) return true;
    const auto rungs = ladder(order_, oom, ctx.device);
    return std::find(rungs.begin(), rungs.end(), Rung::Offload) != rungs.end();
  }

  /// An evaluation's out-of-memory error: a `factor` times smaller eval batch.
  void eval_back_off(const trainer::EventContext& ctx, const trainer::OomInfo& oom, trainer::Control& control) {
    if (oom.attempt - retries_base_ >= s_.max_retries) {
      if (fall_back(ctx, control, oom, true)) return;
      logger_->error("oom_backoff: giving up on this evaluation after {} retries (plugins.oom_backoff.max_retries)",
                     oom.attempt - retries_base_);
      return;
    }
    const std::int64_t cur = oom.micro_batch_size;
    const std::int64_t next = std::max<std::int64_t>(1, static_cast<std::int64_t>(double(cur) * s_.factor));
    if (next >= cur) {
      if (fall_back(ctx, control, oom, true)) return;
      logger_->error("oom_backoff: already at the minimum evaluation batch {}", cur);
      return;
    }
    control.retry_with_micro_batch = next;
    control.reason = std::to_string(cur) + " did not fit";
  }

  /// Backing off is exhausted: move to the next device of fallback_devices that is not the
  /// current one, starting over at the configured micro-batch.
  bool fall_back(const trainer::EventContext& ctx, trainer::Control& control, const trainer::OomInfo& oom, bool eval) {
    while (next_fallback_ < s_.fallback_devices.size() && s_.fallback_devices[next_fallback_] == ctx.device.str())
      ++next_fallback_;
    if (next_fallback_ >= s_.fallback_devices.size()) return false;
    const std::string to = s_.fallback_devices[next_fallback_++];
    control.switch_device = to;
    control.retry_with_micro_batch = eval ? oom.micro_batch_size : configured_;
    control.reason = ctx.device.str() + " exhausted at micro-batch " + std::to_string(oom.micro_batch_size) +
                     ", falling back to " + to;
    logger_->warn("oom_backoff: {}", control.reason);
    if (!eval) current_ = configured_;
    retries_base_ = oom.attempt + 1;
    moved_ = true;
    if (!eval) {  // what fitted or failed on the old device says nothing about the new one
      good_ = bad_ = 0;
      grew_ = false;
      clean_steps_ = 0;
      patience_ = s_.grow_after;
    }
    return true;
  }

  /// After `patience_` clean steps, one step down the ladder, in reverse order: AdamW's moments
  /// back on the device, back toward the configured bits, then half the checkpointed blocks,
  /// then a larger micro-batch.
  void maybe_climb_down(trainer::EventContext& ctx, trainer::Control& control) {
    if (s_.grow_after == 0 || clean_steps_ < patience_) return;
    const trainer::RunState& st = ctx.state;
    if (st.optimizer_offload && st.optimizer_moment_bits > 0) {  // a data-parallel run keeps them there
      control.optimizer_offload = false;
      asked_onto_device_ = true;
      control.reason = std::to_string(clean_steps_) + " clean steps, AdamW's moments back on the device";
    } else if (st.optimizer_moment_bits > 0 && st.optimizer_moment_bits < st.configured_moment_bits) {
      const int next = std::min(st.configured_moment_bits, st.optimizer_moment_bits * 2);
      control.optimizer_moment_bits = next;
      asked_bits_ = next;
      control.reason =
          std::to_string(clean_steps_) + " clean steps, AdamW's moments back to " + std::to_string(next) + " bits";
    } else if (st.checkpointed_blocks > 0) {
      const std::int64_t next = st.checkpointed_blocks / 2;
      control.checkpointed_blocks = next;
      control.reason = std::to_string(clean_steps_) + " clean steps, checkpointing " + std::to_string(next) + " of " +
                       std::to_string(st.model_blocks) + " blocks";
    } else {
      maybe_grow(ctx, control);
      return;
    }
    logger_->info("oom_backoff: {}", control.reason);
    grew_ = true;
    clean_steps_ = 0;
  }

  /// Bisect toward the smallest size known not to fit (so the micro-batch converges on the
  /// largest that fits), probe that size itself once the gap is small (memory may have freed
  /// up), and double freely when no ceiling is known.
  void maybe_grow(trainer::EventContext& ctx, trainer::Control& control) {
    const std::int64_t cur = ctx.state.micro_batch_size;
    if (cur >= configured_) return;
    std::int64_t next = 2 * cur;
    if (bad_ > cur) next = bad_ - cur <= std::max<std::int64_t>(1, cur / 16) ? bad_ : (cur + bad_) / 2;
    next = std::min(next, configured_);
    if (next <= cur) return;
    control.micro_batch_size = next;
    control.reason = std::to_string(clean_steps_) + " clean steps, growing back";
    grew_ = true;
    clean_steps_ = 0;
  }

  OomBackoffSettings s_;
  std::vector<Rung> order_;      ///< the configured ladder (empty: auto)
  std::int64_t configured_ = 0;  ///< training.micro_batch_size as it resolves (0 = batch_size)
  std::int64_t good_ = 0;        ///< largest micro-batch that completed a step since the last failure at it
  std::int64_t bad_ = 0;         ///< smallest micro-batch that ran out of memory (0 = none known)
  std::int64_t clean_steps_ = 0, patience_ = 50, ooms_ = 0;
  bool grew_ = false;                     ///< the last step grew the micro-batch or undid a saver
  bool moved_ = false;                    ///< the run fell back to another device
  bool offload_noted_ = false;            ///< the offload rung's note was logged
  int logged_rung_ = 0;                   ///< memory/rung as last logged
  int asked_bits_ = 0;                    ///< the moment bits asked for at this batch's start (0: none)
  bool asked_onto_device_ = false;        ///< the moments asked back on the device at this batch's start
  bool asked_offload_ = false;            ///< the offload rung was taken for this batch's retry
  bool offload_refused_ = false;          ///< the core did not offload when asked: the rung is left out
  bool partly_offloaded_ = false;         ///< a way back left some moments in host memory, some not
  std::size_t next_fallback_ = 0;         ///< fallback_devices already used
  std::int64_t retries_base_ = 0;         ///< attempt at which retries on the current device began
  std::int64_t current_ = 0;              ///< the micro-batch in use (the one a checkpoint records)
  bool restored_ = false;                 ///< load_state() ran: a resumed run
  bool started_ = false;                  ///< the first batch began (the start_* savers asked for)
  std::int64_t restored_micro_ = 0;       ///< the micro-batch to resume at (0 once applied)
  std::int64_t restored_configured_ = 0;  ///< training.micro_batch_size when it was saved
};

}  // namespace

}  // namespace trainer::oom_backoff

TRAINER_PLUGIN(trainer::oom_backoff::OomBackoffPlugin)
