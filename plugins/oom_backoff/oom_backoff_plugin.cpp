// oom_backoff: the policy half of OOM recovery. The core drops a failed attempt and fires
// OutOfMemory; this plugin answers with a smaller micro-batch (the core re-runs the same
// samples as more micro-batches), and after enough clean steps grows the micro-batch back
// toward the configured size, remembering where it failed so it does not thrash. Where the
// micro-batch does not change the memory needed (reading the batch, the optimizer step) it
// retries once at the same size, then falls back to another device or gives up. What it
// learnt (the micro-batch, the ceiling, the patience) is saved in each checkpoint: a resumed
// run starts at the micro-batch that worked instead of running out of memory again.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "trainer/core_settings.h"
#include "trainer/devices.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"

namespace {

struct OomBackoffSettings : trainer::Settings<OomBackoffSettings> {
  double factor = 0.5;
  std::int64_t min_micro_batch = 1;
  std::int64_t max_retries = 8;
  std::int64_t grow_after = 50;
  bool eval = true;
  std::vector<std::string> fallback_devices;

  static void declare(trainer::SettingsSchema<OomBackoffSettings>& s) {
    s.add(&OomBackoffSettings::factor, "factor", "Micro-batch multiplier after an OOM").min(0, false).max(1, false);
    s.add(&OomBackoffSettings::min_micro_batch, "min_micro_batch", "Give up below this micro-batch").min(1);
    s.add(&OomBackoffSettings::max_retries, "max_retries", "Retries of one batch before giving up").min(0);
    s.add(&OomBackoffSettings::grow_after, "grow_after",
          "Clean steps before trying a micro-batch twice as large; 0 = never")
        .min(0);
    s.add(&OomBackoffSettings::eval, "eval", "Also retry evaluation with a smaller eval batch");
    s.add(&OomBackoffSettings::fallback_devices, "fallback_devices",
          "When backing off is exhausted, move the run to these devices in turn (e.g. [\"cuda:1\", \"cpu\"]) and "
          "retry there at the configured micro-batch")
        .check(trainer::device_setting_check());
  }
};

class OomBackoffPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "oom_backoff"; }
  std::string description() const override {
    return "On out-of-memory, retry the same batch with a smaller micro-batch; grow back after clean steps";
  }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::Resume, E::FitStart, E::BatchStart, E::AfterOptimizerStep, E::OutOfMemory, E::FitEnd};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return OomBackoffSettings::keys(); }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = OomBackoffSettings::from(section);
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
          logger_->info("oom_backoff: restored micro-batch {} (ceiling {}, {} clean steps of {} before growing)",
                        restored_micro_, bad_ > 0 ? std::to_string(bad_) : std::string("none"), clean_steps_,
                        patience_);
        }
        break;
      case trainer::Event::FitStart: {
        configured_ = trainer::TrainingSettings::from(ctx.config->sub("training")).micro_batch();
        current_ = configured_;
        if (!restored_) patience_ = s_.grow_after;
        if (restored_configured_ != 0 && restored_configured_ != configured_) {
          // What was learnt for another configured size still says what fits; sizes above the
          // new configured one are not used.
          restored_micro_ = std::min(restored_micro_, configured_);
        }
        break;
      }
      case trainer::Event::AfterOptimizerStep: {
        const std::int64_t cur = ctx.state.micro_batch_size;
        good_ = std::max(good_, cur);
        if (bad_ > 0 && cur >= bad_) bad_ = 0;  // the ceiling was stale: memory freed up
        if (grew_) patience_ = s_.grow_after;   // a grow that worked resets the patience
        grew_ = false;
        ++clean_steps_;
        break;
      }
      case trainer::Event::BatchStart:
        current_ = ctx.state.micro_batch_size;
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
        maybe_grow(ctx, control);
        if (control.micro_batch_size) current_ = *control.micro_batch_size;
        break;
      case trainer::Event::OutOfMemory:
        on_oom(ctx, control);
        break;
      case trainer::Event::FitEnd:
        if (ooms_ > 0) {
          logger_->info("oom_backoff: {} out-of-memory error(s) recovered; micro-batch now {} (configured {})", ooms_,
                        ctx.state.micro_batch_size, configured_);
        }
        break;
      default:
        break;
    }
  }

 private:
  void on_oom(trainer::EventContext& ctx, trainer::Control& control) {
    const trainer::OomInfo& oom = *ctx.oom;
    ++ooms_;
    if (oom.phase == trainer::OomPhase::Checkpoint) return;  // the core retries a checkpoint once by itself
    const bool eval = oom.phase == trainer::OomPhase::Eval;
    if (eval && !s_.eval) return;
    if (oom.attempt == 0) retries_base_ = 0;  // a new batch (or evaluation)
    if (!oom.micro_batch_helps) {
      // Reading the batch, the optimizer step: the memory does not depend on the micro-batch.
      // Retry once at the same size (the core freed its cached memory), then move elsewhere;
      // no ceiling is learnt from it.
      if (oom.attempt - retries_base_ == 0) {
        control.retry_with_micro_batch = oom.micro_batch_size;
        control.reason = std::string("out of memory in ") + trainer::oom_phase_name(oom.phase) +
                         ", which the micro-batch does not change; " + "retrying once after freeing cached memory";
        return;
      }
      if (fall_back(ctx, control, oom, eval)) return;
      logger_->error("oom_backoff: out of memory in {} again; a smaller micro-batch cannot help there",
                     trainer::oom_phase_name(oom.phase));
      return;
    }
    if (oom.attempt - retries_base_ >= s_.max_retries) {
      if (fall_back(ctx, control, oom, eval)) return;
      logger_->error("oom_backoff: giving up on this batch after {} retries (plugins.oom_backoff.max_retries)",
                     oom.attempt - retries_base_);
      return;
    }
    const std::int64_t cur = oom.micro_batch_size;
    const std::int64_t floor = eval ? 1 : s_.min_micro_batch;
    std::int64_t next = std::max<std::int64_t>(floor, static_cast<std::int64_t>(double(cur) * s_.factor));
    if (!eval) {
      bad_ = bad_ > 0 ? std::min(bad_, cur) : cur;    // the smallest size known not to fit
      if (cur <= good_) good_ = 0;                    // a size that fitted no longer does
      if (good_ > next && good_ < cur) next = good_;  // back to the largest size known to fit
      // A failure right after growing means the larger size does not fit (yet): wait twice
      // as long before the next attempt instead of failing every few steps.
      if (grew_) patience_ = std::max<std::int64_t>(patience_ * 2, s_.grow_after);
      grew_ = false;
      clean_steps_ = 0;
    }
    if (next >= cur) {
      if (fall_back(ctx, control, oom, eval)) return;
      logger_->error("oom_backoff: already at the minimum micro-batch {} (plugins.oom_backoff.min_micro_batch)", cur);
      return;
    }
    control.retry_with_micro_batch = next;
    control.reason = std::to_string(cur) + " did not fit";
    if (!eval) current_ = next;
  }

  /// Backing off is exhausted: move to the next device of fallback_devices that is not the
  /// current one, starting over at the configured micro-batch (eval: the same eval batch).
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
    if (!eval) {  // what fitted or failed on the old device says nothing about the new one
      good_ = bad_ = 0;
      grew_ = false;
      clean_steps_ = 0;
      patience_ = s_.grow_after;
    }
    return true;
  }

  /// After `patience_` clean steps: bisect toward the smallest size known not to fit (so the
  /// micro-batch converges on the largest that fits), probe that size itself once the gap is
  /// small (memory may have freed up), and double freely when no ceiling is known.
  void maybe_grow(trainer::EventContext& ctx, trainer::Control& control) {
    const std::int64_t cur = ctx.state.micro_batch_size;
    if (s_.grow_after == 0 || cur >= configured_ || clean_steps_ < patience_) return;
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
  std::int64_t configured_ = 0;  ///< training.micro_batch_size as it resolves (0 = batch_size)
  std::int64_t good_ = 0;        ///< largest micro-batch that completed a step since the last failure at it
  std::int64_t bad_ = 0;         ///< smallest micro-batch that ran out of memory (0 = none known)
  std::int64_t clean_steps_ = 0, patience_ = 50, ooms_ = 0;
  bool grew_ = false;
  std::size_t next_fallback_ = 0;         ///< fallback_devices already used
  std::int64_t retries_base_ = 0;         ///< attempt at which retries on the current device began
  std::int64_t current_ = 0;              ///< the micro-batch in use (the one a checkpoint records)
  bool restored_ = false;                 ///< load_state() ran: a resumed run
  std::int64_t restored_micro_ = 0;       ///< the micro-batch to resume at (0 once applied)
  std::int64_t restored_configured_ = 0;  ///< training.micro_batch_size when it was saved
};

}  // namespace

TRAINER_PLUGIN(OomBackoffPlugin)
