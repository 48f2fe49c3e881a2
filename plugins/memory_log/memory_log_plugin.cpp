// memory_log: where the memory went. Logs allocated / reserved / peak at the milestones of a
// run (and every N steps if asked) as log lines and as memory/* metrics, and prints a
// summary at FitEnd. The peak window restarts at FitStart, so that what training itself
// needs is told apart from what building the model and loading its weights needed.
#include <spdlog/spdlog.h>

#include <map>
#include <string>

#include "trainer/memory.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"

namespace {

struct MemoryLogSettings : trainer::Settings<MemoryLogSettings> {
  std::int64_t every_steps = 0;

  static void declare(trainer::SettingsSchema<MemoryLogSettings>& s) {
    s.add(&MemoryLogSettings::every_steps, "every_steps", "Also log every N optimizer steps; 0 = only at milestones")
        .min(0);
  }
};

class MemoryLogPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "memory_log"; }
  std::string description() const override { return "Logs allocated/reserved/peak memory as log lines and metrics"; }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::Init,        E::ModelToDevice, E::OptimizerCreated, E::FitStart, E::EpochStart,
            E::OutOfMemory, E::BatchEnd,      E::FitEnd,           E::Exception};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return MemoryLogSettings::keys(); }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    every_ = MemoryLogSettings::from(section).every_steps;
  }

  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (!trainer::has_memory_backend(ctx.device)) return;  // e.g. CUDA in a CPU-only build
    const trainer::Event e = ctx.event;
    if (e == trainer::Event::BatchEnd && (every_ == 0 || ctx.state.global_step % every_ != 0)) return;
    const trainer::MemoryStats s = trainer::memory_stats(ctx.device);
    max_peak_ = std::max(max_peak_, s.peak_allocated);
    if (fit_started_) fit_peak_ = std::max(fit_peak_, s.peak_allocated);
    if (e == trainer::Event::FitEnd || e == trainer::Event::Exception) {  // the summary, also for a failed run
      const std::string training = fit_started_
                                       ? trainer::format_bytes(fit_peak_) + " while training (" +
                                             trainer::format_bytes(fit_peak_ - fit_base_) + " above its start), "
                                       : std::string();
      logger_->info("memory summary ({}): peak {} allocated, {}{} now, {} out-of-memory errors, budget {}",
                    ctx.device.str(), trainer::format_bytes(max_peak_), training, trainer::format_bytes(s.allocated),
                    s.num_ooms, s.limit > 0 ? trainer::format_bytes(s.limit) : std::string("none"));
    } else if (e == trainer::Event::OutOfMemory && ctx.oom) {
      logger_->warn(
          "memory at OutOfMemory ({}, micro-batch {}): {} allocated, {} requested, budget {}{}",
          trainer::oom_phase_name(ctx.oom->phase), ctx.oom->micro_batch_size, trainer::format_bytes(s.allocated),
          trainer::format_bytes(ctx.oom->requested_bytes),
          s.limit > 0 ? trainer::format_bytes(s.limit) : std::string("none"),
          ctx.oom->live ? "; live at the failure: " + trainer::largest_category_text(*ctx.oom->live) : std::string());
    } else {
      logger_->info("memory at {}: {} allocated, {} reserved, {} peak", trainer::event_name(e),
                    trainer::format_bytes(s.allocated), trainer::format_bytes(s.reserved),
                    trainer::format_bytes(s.peak_allocated));
    }
    constexpr double kMiB = 1024.0 * 1024.0;
    std::map<std::string, double> values = {{"memory/allocated_mb", double(s.allocated) / kMiB},
                                            {"memory/reserved_mb", double(s.reserved) / kMiB},
                                            {"memory/peak_mb", double(s.peak_allocated) / kMiB},
                                            {"memory/num_ooms", double(s.num_ooms)}};
    if (trainer::has_memory_categories(ctx.device)) {  // memory/parameters_mb, memory/activations_mb, ...
      const trainer::MemoryBreakdown b = trainer::memory_breakdown(ctx.device);
      for (std::size_t i = 0; i < trainer::kMemoryCategoryCount; ++i) {
        const auto name = trainer::memory_category_name(static_cast<trainer::MemoryCategory>(i));
        values[std::string("memory/") + name + "_mb"] = double(b.bytes[i]) / kMiB;
      }
      values["memory/slack_mb"] = double(b.slack()) / kMiB;
    }
    ctx.metrics->log(ctx.state.global_step, values);
    if (e == trainer::Event::FitStart) {  // from here on, the peaks are training's
      trainer::reset_peak_memory(ctx.device);
      fit_started_ = true;
      fit_base_ = fit_peak_ = s.allocated;
    }
  }

 private:
  std::int64_t every_ = 0;
  std::int64_t max_peak_ = 0;
  bool fit_started_ = false;
  std::int64_t fit_base_ = 0;  ///< allocated at FitStart
  std::int64_t fit_peak_ = 0;  ///< highest peak seen since FitStart
};

}  // namespace

TRAINER_PLUGIN(MemoryLogPlugin)
