// early_stopping: stops the run when an evaluation metric has stopped improving (Lightning's
// EarlyStopping), and optionally keeps the checkpoint of the best evaluation as
// checkpoints/best.pt. Its state (best value, evaluations without improvement) is saved in
// every checkpoint, so a resumed run goes on counting instead of starting over.
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

#include "trainer/core_settings.h"
#include "trainer/durable_file.h"
#include "trainer/error.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"

namespace fs = std::filesystem;

namespace {

struct EarlyStoppingSettings : trainer::Settings<EarlyStoppingSettings> {
  std::optional<std::string> monitor;  ///< unset: checkpoint.monitor when set, else eval/loss
  std::optional<std::string> mode;     ///< unset: checkpoint.mode with checkpoint.monitor, else min
  std::int64_t patience = 3;
  double min_delta = 0.0;
  bool save_best = false;

  static void declare(trainer::SettingsSchema<EarlyStoppingSettings>& s) {
    s.add(&EarlyStoppingSettings::monitor, "monitor",
          "Evaluation metric to watch (eval/loss, eval/accuracy, or one a plugin adds in EvalMetrics); unset: "
          "checkpoint.monitor when set, else eval/loss");
    s.add(&EarlyStoppingSettings::mode, "mode",
          "min: lower is better; max: higher is better; unset: checkpoint.mode when watching checkpoint.monitor, "
          "else min")
        .choices({"min", "max"});
    s.add(&EarlyStoppingSettings::patience, "patience", "Evaluations without improvement before stopping").min(0);
    s.add(&EarlyStoppingSettings::min_delta, "min_delta", "Smallest change that counts as an improvement").min(0);
    s.add(&EarlyStoppingSettings::save_best, "save_best",
          "Checkpoint each new best evaluation and keep it as checkpoints/best.pt");
  }
};

/// `to` becomes `from`'s contents atomically: a hard link (a copy where links fail) under a
/// temporary name, renamed over `to`.
void replace_with(const fs::path& from, const fs::path& to) {
  const fs::path tmp = to.string() + ".tmp";
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_hard_link(from, tmp, ec);  // fails on anything at the name: never through a link
  if (ec) {
    // The copy goes through a temporary created new (a link found at its name is removed).
    std::ifstream in(from, std::ios::binary);
    TRAINER_CHECK(in.good(), "early_stopping: cannot read ", from.string());
    trainer::write_atomic(to.string(), [&in](std::ostream& out) { out << in.rdbuf(); });
    return;
  }
  fs::rename(tmp, to);
}

class EarlyStoppingPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "early_stopping"; }
  std::string description() const override {
    return "Stop when an evaluation metric stops improving; optionally keep the best checkpoint";
  }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::Init, E::Resume, E::FitStart, E::EvalEnd, E::Checkpoint};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return EarlyStoppingSettings::keys(); }
  // A monitor that names no metric is a usage error (exit code 2), not something to log and
  // train on with.
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = EarlyStoppingSettings::from(section);
  }

  /// What a resume restores, each member named once.
  trainer::StateFields progress() {
    return trainer::StateFields()
        .add("has_best", has_best_)
        .add("best", best_)
        .add("best_step", best_step_)
        .add("wait", wait_)
        .add("stopped", stopped_)
        .add("best_checkpoint", best_checkpoint_);
  }
  void save_state(trainer::PluginState& state) override {
    // What was watched, so that a resume that watches something else starts afresh.
    state.set_string("monitor", monitor_);
    state.set_string("mode", mode_);
    progress().save(state);
  }
  void load_state(const trainer::PluginState& state) override {
    const std::string monitored = state.get_string("monitor"), mode = state.get_string("mode", mode_);
    if (monitored != monitor_ || mode != mode_) {
      logger_->warn("early_stopping: the checkpoint watched {} ({}), this run watches {} ({}): starting afresh",
                    monitored, mode, monitor_, mode_);
      return;
    }
    progress().load(state);
  }

  void on_event(trainer::EventContext& ctx, trainer::Control& control) override {
    switch (ctx.event) {
      case trainer::Event::Init: {
        // The metric the checkpoints are kept by, unless this plugin names its own.
        const auto checkpoint = trainer::CheckpointSettings::from(ctx.config->sub("checkpoint"));
        const bool follow = !s_.monitor && !checkpoint.monitor.empty();
        monitor_ = s_.monitor.value_or(follow ? checkpoint.monitor : "eval/loss");
        monitor_key_ = follow ? "checkpoint.monitor" : "plugins.early_stopping.monitor";
        mode_ = s_.mode.value_or(follow ? checkpoint.mode : "min");
        break;
      }
      case trainer::Event::Resume:
        if (has_best_) {
          logger_->info("early_stopping: restored best {} = {:.6g} at step {}, {} evaluation(s) without improvement",
                        monitor_, best_, best_step_, wait_);
        }
        break;
      case trainer::Event::FitStart: {
        const auto eval = trainer::EvalSettings::from(ctx.config->sub("eval"));
        TRAINER_CHECK_T(trainer::UsageError, eval.every_epochs > 0 || eval.every_steps > 0,
                        "plugins.early_stopping watches evaluation metrics, but eval.every_epochs = 0 and "
                        "eval.every_steps = 0 never evaluate during training; set eval.every_epochs (e.g. 1) or "
                        "eval.every_steps");
        // Stopped before the checkpoint it resumes from, and still out of patience.
        if (stopped_ && wait_ >= s_.patience) {
          control.stop_training = true;
          control.reason = "already stopped before the resume: " + why();
        }
        break;
      }
      case trainer::Event::EvalEnd:
        check(ctx, control);
        break;
      case trainer::Event::Checkpoint:
        if (best_pending_ && ctx.state.global_step == best_step_) keep_best(ctx.checkpoint_path);
        best_pending_ = false;  // a checkpoint of another step is not the best model's
        break;
      default:
        break;
    }
  }

 private:
  void check(const trainer::EventContext& ctx, trainer::Control& control) {
    const auto& m = *ctx.eval_metrics;
    const auto it = m.find(monitor_);
    if (it == m.end()) {
      std::vector<std::string> names;
      for (const auto& kv : m) names.push_back(kv.first);
      throw trainer::UsageError(monitor_key_ + " = '" + monitor_ + "'" +
                                (monitor_key_ == "checkpoint.monitor" ? " (which early_stopping watches)" : "") +
                                " is not among the evaluation's metrics (" + fmt::to_string(fmt::join(names, ", ")) +
                                ")");
    }
    const double v = it->second;
    if (!std::isfinite(v)) {
      stopped_ = true;
      control.stop_training = true;
      control.reason = monitor_ + " is " + std::to_string(v) + " at step " + std::to_string(ctx.state.global_step);
      return;
    }
    const bool better = !has_best_ || (mode_ == "min" ? v < best_ - s_.min_delta : v > best_ + s_.min_delta);
    if (better) {
      has_best_ = true;
      best_ = v;
      best_step_ = ctx.state.global_step;
      wait_ = 0;
      if (s_.save_best) {
        best_pending_ = true;
        control.request_checkpoint = true;
        control.reason = "new best " + monitor_;
      }
      return;
    }
    ++wait_;
    logger_->info("early_stopping: {} = {:.6g}, no improvement on {:.6g} (step {}) for {} of {} evaluation(s)",
                  monitor_, v, best_, best_step_, wait_, s_.patience);
    if (wait_ >= s_.patience) {
      stopped_ = true;
      control.stop_training = true;
      control.reason = why();
    }
  }

  /// checkpoints/best.pt becomes `file` (with its digest). A failure is logged: the run goes on.
  void keep_best(const std::string& file) {
    const fs::path best = fs::path(file).parent_path() / "best.pt";
    try {
      std::error_code ec;
      fs::remove(best.string() + ".sum", ec);  // a digest goes only with the file it describes
      replace_with(file, best);
      if (fs::exists(file + ".sum")) replace_with(file + ".sum", best.string() + ".sum");
      best_checkpoint_ = best.string();
      logger_->info("early_stopping: best {} = {:.6g} kept as {}", monitor_, best_, best_checkpoint_);
    } catch (const std::exception& e) {
      logger_->error("early_stopping: cannot keep {} as {}: {}", file, best.string(), e.what());
    }
  }

  std::string why() const {
    char best[32];
    std::snprintf(best, sizeof best, "%.6g", best_);
    return "no improvement of " + monitor_ + " (" + mode_ + ") for " + std::to_string(wait_) + " evaluation(s); best " +
           best + " at step " + std::to_string(best_step_);
  }

  EarlyStoppingSettings s_;
  std::string monitor_ = "eval/loss", mode_ = "min";            ///< what is watched (Init resolves the unset keys)
  std::string monitor_key_ = "plugins.early_stopping.monitor";  ///< where monitor_ came from, for messages
  bool has_best_ = false, stopped_ = false, best_pending_ = false;
  double best_ = 0.0;
  std::int64_t best_step_ = 0, wait_ = 0;
  std::string best_checkpoint_;
};

}  // namespace

TRAINER_PLUGIN(EarlyStoppingPlugin)
