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
#include <array>
#include <set>

#include "trainer/core_settings.h"
#include "trainer/devices.h"
#include "trainer/error.h"
#include "trainer/memory.h"
#include "trainer/metrics.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"

namespace {

/// The rungs of the ladder, in their default order (RungName's names).
enum class Rung { MicroBatch, Checkpoint, OptimizerBf16, Optimizer8bit, Offload, Device };
constexpr std::array<const char*, 6> kRungNames = {"micro_batch",    "checkpoint", "optimizer_bf16",
                                                   "optimizer_8bit", "offload",    "device"};
const char* rung_name(Rung r) { return kRungNames[static_cast<std::size_t>(r)]; }

struct OomBackoffSettings : trainer::Settings<OomBackoffSettings> {
  double factor = 0.5;
  std::int64_t min_micro_batch = 1;
  std::int64_t max_retries = 16;
  std::int64_t grow_after = 50;
  bool eval = true;
  std::vector<std::string> fallback_devices;
  std::vector<std::string> ladder{"auto"};
  bool allow_inexact = false;
  std::int64_t start_checkpointed_blocks = 0;
  std::int64_t start_moment_bits = 0;
  bool start_offload = false;

  static void declare(trainer::SettingsSchema<OomBackoffSettings>& s) {
    s.add(&OomBackoffSettings::factor, "factor", "Micro-batch multiplier after an OOM").min(0, false).max(1, false);
    s.add(&OomBackoffSettings::min_micro_batch, "min_micro_batch", "Give up below this micro-batch").min(1);
    s.add(&OomBackoffSettings::max_retries, "max_retries", "Retries of one batch before giving up").min(0);
    s.add(&OomBackoffSettings::grow_after, "grow_after",
          "Clean steps before taking one memory saver off (more moment bits, fewer checkpointed blocks, a "
          "micro-batch twice as large); 0 = never")
        .min(0);
    s.add(&OomBackoffSettings::eval, "eval", "Also retry evaluation with a smaller eval batch");
    s.add(&OomBackoffSettings::fallback_devices, "fallback_devices",
          "When backing off is exhausted, move the run to these devices in turn (e.g. [\"cuda:1\", \"cpu\"]) and "
          "retry there at the configured micro-batch")
        .check(trainer::device_setting_check());
    s.add(&OomBackoffSettings::ladder, "ladder",
          "The memory savers to climb after an out-of-memory error, first applicable first: any of micro_batch, "
          "checkpoint, optimizer_bf16, optimizer_8bit, offload, device; [\"auto\"] orders them by what was full")
        .choices({"auto", "micro_batch", "checkpoint", "optimizer_bf16", "optimizer_8bit", "offload", "device"});
    s.add(&OomBackoffSettings::allow_inexact, "allow_inexact",
          "Allow the rungs that change results (optimizer_bf16, optimizer_8bit: AdamW's moments in fewer bits)");
    s.add(&OomBackoffSettings::start_checkpointed_blocks, "start_checkpointed_blocks",
          "Start on the ladder with this many blocks checkpointed (the first ones), climbed down after grow_after "
          "clean steps like a rung taken; trainer sweep sets it for a trial predicted to fit only there")
        .min(0);
    s.add(&OomBackoffSettings::start_moment_bits, "start_moment_bits",
          "Start with AdamW's moments in 16 or 8 bits, fewer than the optimizer's (needs allow_inexact; 0 = as "
          "configured), climbed down like a rung taken")
        .min(0)
        .max(16);
    s.add(&OomBackoffSettings::start_offload, "start_offload",
          "Start with AdamW's moments in host memory, streamed through each optimizer step (a GPU only; exact), "
          "moved back like a rung taken");
  }
};

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
    const std::string key = section.origin("ladder");
    TRAINER_CHECK_T(trainer::UsageError, !s_.ladder.empty(), key,
                    ": plugins.oom_backoff.ladder is empty; give [\"auto\"] or the rungs to climb");
    std::set<std::string> seen;
    for (const auto& r : s_.ladder) {
      TRAINER_CHECK_T(trainer::UsageError, r != "auto" || s_.ladder.size() == 1, key,
                      ": \"auto\" in plugins.oom_backoff.ladder stands alone ([\"auto\"]), not among named rungs");
      TRAINER_CHECK_T(trainer::UsageError, seen.insert(r).second, key, ": rung \"", r,
                      "\" is named twice in plugins.oom_backoff.ladder");
      if (r != "auto") {
        order_.push_back(static_cast<Rung>(std::find(kRungNames.begin(), kRungNames.end(), r) - kRungNames.begin()));
      }
    }
    TRAINER_CHECK_T(
        trainer::UsageError, s_.start_moment_bits == 0 || s_.start_moment_bits == 16 || s_.start_moment_bits == 8,
        section.origin("start_moment_bits"), ": plugins.oom_backoff.start_moment_bits = ", s_.start_moment_bits,
        "; allowed: 0 (as configured), 16, 8");
    TRAINER_CHECK_T(trainer::UsageError, s_.allow_inexact || s_.start_moment_bits == 0,
                    section.origin("start_moment_bits"),
                    ": plugins.oom_backoff.start_moment_bits = ", s_.start_moment_bits,
                    " changes results (AdamW's moments rounded); set plugins.oom_backoff.allow_inexact = true too");
    if (!order_.empty() && !s_.fallback_devices.empty() &&
        std::find(order_.begin(), order_.end(), Rung::Device) == order_.end()) {
      order_.push_back(Rung::Device);  // fallback_devices are where the run goes when the rest is used up
    }
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
        const auto refuse = [](const char* key, const std::string& value, const std::string& why) {
          throw trainer::ExitRequest(trainer::kExitUsage, trainer::RunStatus::Failed,
                                     std::string("plugins.oom_backoff.") + key + " = " + value + ": " + why);
        };
        const trainer::RunState& st = ctx.state;
        if (s_.start_checkpointed_blocks > st.model_blocks) {
          refuse("start_checkpointed_blocks", std::to_string(s_.start_checkpointed_blocks),
                 "the model has " + std::to_string(st.model_blocks) +
                     " blocks the core can checkpoint (blocks another plugin wraps do not count)");
        }
        if (s_.start_moment_bits != 0 && st.optimizer_moment_bits == 0) {
          refuse("start_moment_bits", std::to_string(s_.start_moment_bits),
                 "the optimizer's moments cannot change their bits (AdamW's and adamw8bit's can, outside a "
                 "data-parallel run)");
        }
        if (s_.start_moment_bits != 0 && s_.start_moment_bits >= st.configured_moment_bits) {
          refuse("start_moment_bits", std::to_string(s_.start_moment_bits),
                 "the optimizer keeps its moments in " + std::to_string(st.configured_moment_bits) +
                     " bits already; a start on the ladder has fewer (16 or 8)");
        }
        if (s_.start_offload && ctx.device.is_cpu()) {
          refuse("start_offload", "true",
                 "the run is on the CPU, whose memory is the host's: there is nothing to offload");
        }
        if (s_.start_offload && st.optimizer_moment_bits == 0) {
          refuse("start_offload", "true",
                 "the optimizer's moments cannot move to host memory (AdamW's and adamw8bit's can, outside a "
                 "data-parallel run)");
        }
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
  /// "6 of 12 blocks checkpointed, AdamW moments in 16 bits (inexact)": the savers on beyond the micro-batch.
  static std::string savers_text(const trainer::RunState& st) {
    std::string out;
    if (st.checkpointed_blocks > 0) {
      out = std::to_string(st.checkpointed_blocks) + " of " + std::to_string(st.model_blocks) + " blocks checkpointed";
    }
    if (st.optimizer_moment_bits != st.configured_moment_bits) {
      out += (out.empty() ? "" : ", ") + std::string("AdamW moments in ") + std::to_string(st.optimizer_moment_bits) +
             " bits (inexact)";
    }
    if (st.optimizer_offload) out += (out.empty() ? "" : ", ") + std::string("AdamW moments in host memory");
    return out;
  }

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

  /// What was full when the allocation was refused: the optimizer state (the optimizer step, or
  /// the breakdown's largest category), else the activations.
  static bool optimizer_full(const trainer::OomInfo& oom) {
    if (oom.phase == trainer::OomPhase::OptimizerStep) return true;
    return oom.live && oom.live->largest() == trainer::MemoryCategory::OptimizerState;
  }

  /// The rungs to try, in order: the configured ladder, or for "auto" by what was full. With
  /// activations full, checkpointing comes before a smaller micro-batch once the micro-batch is
  /// small, where halving it again costs more time per sample than recomputing the blocks: on
  /// the CPU at 2 (measured, bench/memory/ladder_bench.cpp: a ViT's step at micro-batches of 1
  /// takes 28 % longer than at 2, checkpointing every block 27-34 %), on a GPU at 8 (its
  /// kernels fill the device less at small batches; to be measured there).
  std::vector<Rung> ladder(const trainer::OomInfo& oom, const c10::Device& device) const {
    if (!order_.empty()) return order_;
    using R = Rung;
    if (optimizer_full(oom))
      return {R::OptimizerBf16, R::Optimizer8bit, R::Offload, R::MicroBatch, R::Checkpoint, R::Device};
    const std::int64_t cur = oom.micro_batch_size;
    const bool small = cur <= (device.is_cpu() ? 2 : 8);
    if (small) return {R::Checkpoint, R::MicroBatch, R::OptimizerBf16, R::Optimizer8bit, R::Offload, R::Device};
    return {R::MicroBatch, R::Checkpoint, R::OptimizerBf16, R::Optimizer8bit, R::Offload, R::Device};
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
    for (const Rung r : ladder(oom, ctx.device)) {
      if (take(r, ctx, control, oom, skipped)) {
        logger_->warn("oom_backoff: rung {}: out of memory in {}{}; {}", rung_name(r),
                      trainer::oom_phase_name(oom.phase),
                      oom.live ? " with " + trainer::largest_category_text(*oom.live) : std::string(), control.reason);
        return;
      }
    }
    control.reason = "the ladder (" + ladder_text(oom, ctx.device) + ") has no rung left for out of memory in " +
                     trainer::oom_phase_name(oom.phase) + skipped;
    logger_->error("oom_backoff: {}", control.reason);
  }

  std::string ladder_text(const trainer::OomInfo& oom, const c10::Device& device) const {
    std::string out;
    for (const Rung r : ladder(oom, device)) out += (out.empty() ? "" : ", ") + std::string(rung_name(r));
    return order_.empty() ? "auto: " + out : out;
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
    const auto rungs = ladder(oom, ctx.device);
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

TRAINER_PLUGIN(OomBackoffPlugin)
