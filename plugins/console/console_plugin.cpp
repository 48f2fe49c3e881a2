// console: a progress line on a terminal, periodic plain lines otherwise.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "trainer/distributed.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string hms(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

struct ConsoleSettings : trainer::Settings<ConsoleSettings> {
  std::int64_t every_steps = 100;
  double every_s = 30.0;
  std::string mode = "auto";
  bool metrics = true;

  static void declare(trainer::SettingsSchema<ConsoleSettings>& s) {
    s.add(&ConsoleSettings::every_steps, "every_steps", "Plain mode: print every N optimizer steps").min(1);
    s.add(&ConsoleSettings::every_s, "every_s",
          "Plain mode: also print when this many seconds passed since the last line; 0 = only every_steps")
        .min(0);
    s.add(&ConsoleSettings::mode, "mode", "auto picks tty when stdout is a terminal").choices({"auto", "tty", "plain"});
    s.add(&ConsoleSettings::metrics, "metrics",
          "Add the latest value of every other training metric (train/grad_norm, plugins' metrics) to the line");
  }
};

class ConsolePlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "console"; }
  std::string description() const override {
    return "Progress line: epoch, step/total, loss, LR, samples/s, ETA, other metrics";
  }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::FitStart, E::BatchEnd, E::EvalEnd, E::EpochEnd, E::FitEnd};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return ConsoleSettings::keys(); }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    const auto s = ConsoleSettings::from(section);
    every_ = s.every_steps;
    every_s_ = s.every_s;
    metrics_ = s.metrics;
    tty_ = s.mode == "tty" || (s.mode == "auto" && isatty(STDOUT_FILENO));
    rank_ = trainer::rank_of_this_process();
  }

  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (rank_ != 0) return;  // one progress line for a data-parallel run: rank 0's (its metrics are the run's)
    const auto& s = ctx.state;
    metrics_log_ = ctx.metrics;
    switch (ctx.event) {
      case trainer::Event::FitStart:
        start_ = last_draw_ = Clock::now();
        start_step_ = s.global_step;
        start_samples_ = s.samples_seen;
        break;
      case trainer::Event::BatchEnd: {
        const auto now = Clock::now();
        if (tty_) {
          if (now - last_draw_ < std::chrono::milliseconds(100) && s.global_step < s.total_steps) return;
          std::printf("\r%s\033[K", line(s, now).c_str());
          std::fflush(stdout);
          drawn_ = true;
          last_draw_ = now;
        } else if (s.global_step != printed_step_ &&
                   (s.global_step % every_ == 0 ||
                    (every_s_ > 0 && now - last_draw_ >= std::chrono::duration<double>(every_s_)))) {
          print_line(s, now);
        }
        break;
      }
      case trainer::Event::EvalEnd:
        end_line();
        if (ctx.eval_metrics) {
          std::string text = "eval  epoch " + std::to_string(s.epoch + 1) + "/" + std::to_string(s.num_epochs);
          for (const auto& kv : *ctx.eval_metrics) {
            char buf[96];
            std::snprintf(buf, sizeof buf, " | %s %.4f", kv.first.c_str(), kv.second);
            text += buf;
          }
          std::printf("%s\n", text.c_str());
          std::fflush(stdout);
        }
        break;
      case trainer::Event::EpochEnd:
        end_line();
        if (!tty_) print_line(s, Clock::now());
        break;
      case trainer::Event::FitEnd: {
        end_line();
        // The values the run ends with, unless the last line printed showed them.
        if (!tty_ && s.global_step != printed_step_ && s.global_step > start_step_) print_line(s, Clock::now());
        const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
        std::printf("done: %lld steps in %s (%s)\n", static_cast<long long>(s.global_step), hms(secs).c_str(),
                    trainer::run_status_name(ctx.status));
        std::fflush(stdout);
        break;
      }
      default:
        break;
    }
  }

 private:
  std::string line(const trainer::RunState& s, Clock::time_point now) const {
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double steps_done = double(s.global_step - start_step_);
    const double rate = secs > 0 ? double(s.samples_seen - start_samples_) / secs : 0.0;
    const double eta = steps_done > 0 ? secs / steps_done * double(s.total_steps - s.global_step) : -1.0;
    char buf[256];
    std::snprintf(buf, sizeof buf, "epoch %lld/%lld | step %lld/%lld | loss %.4f | lr %.4g | %.0f samples/s | ETA %s",
                  static_cast<long long>(s.epoch + 1), static_cast<long long>(s.num_epochs),
                  static_cast<long long>(s.global_step), static_cast<long long>(s.total_steps), s.loss, s.lr, rate,
                  hms(eta).c_str());
    std::string out = buf;
    if (metrics_ && metrics_log_) {
      for (const auto& [name, value] : metrics_log_->latest()) {
        if (on_line(name)) continue;
        char v[96];
        std::snprintf(v, sizeof v, " | %s %.4g", name.c_str(), value);
        out += v;
      }
    }
    return out;
  }
  /// Shown by the line already (loss, learning rate, throughput, epoch), or on the eval line.
  static bool on_line(const std::string& name) {
    return name == "train/loss" || name == "train/lr" || name == "train/epoch" || name == "train/samples_per_s" ||
           name.rfind("eval/", 0) == 0;
  }
  /// Plain mode: one line now.
  void print_line(const trainer::RunState& s, Clock::time_point now) {
    std::printf("%s\n", line(s, now).c_str());
    std::fflush(stdout);
    last_draw_ = now;
    printed_step_ = s.global_step;
  }
  void end_line() {
    if (tty_ && drawn_) {
      std::printf("\n");
      drawn_ = false;
    }
  }

  std::int64_t every_ = 100;
  double every_s_ = 30.0;
  std::int64_t printed_step_ = -1;  ///< plain mode: the step of the last line printed
  bool tty_ = false, drawn_ = false, metrics_ = true;
  std::int64_t rank_ = 0;  ///< this process's rank in a data-parallel run
  trainer::MetricsLogger* metrics_log_ = nullptr;
  Clock::time_point start_, last_draw_;
  std::int64_t start_step_ = 0, start_samples_ = 0;
};

}  // namespace

TRAINER_PLUGIN(ConsolePlugin)
