#include "lr_find.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trainer/durable_file.h"
#include "trainer/error.h"
#include "trainer/plugin.h"
#include "trainer/recipe.h"
#include "trainer/trainer.h"

namespace trainer::tune {
namespace {

/// Records each optimizer step's learning rate and loss, smooths the loss as it goes and stops
/// the run once the smoothed loss passes `factor` times its best (or is not finite). It runs
/// last in dispatch order, after the plugins that change the step.
class LrFindRecorder final : public Plugin {
 public:
  LrFindRecorder(LrFindResult& out, double beta, double factor) : out_(out), beta_(beta), factor_(factor) {}
  std::string name() const override { return "lr_find"; }
  std::vector<Event> events() const override { return {Event::BatchEnd}; }
  int default_priority() const override { return 1000000; }

  void on_event(EventContext& ctx, Control& control) override {
    // A batch without an optimizer step (a GradScaler's skip) ran at no new rate.
    if (ctx.state.global_step == 0 || (!out_.points.empty() && ctx.state.global_step == out_.points.back().step)) {
      return;
    }
    LrFindPoint p;
    p.step = ctx.state.global_step;
    p.lr = ctx.state.lr;
    p.loss = ctx.state.loss;
    // As Lightning's finder: the bias correction counts the step after it was taken (from 1),
    // and the divergence check starts at the second step.
    avg_ = beta_ * avg_ + (1.0 - beta_) * p.loss;
    p.smoothed = avg_ / (1.0 - std::pow(beta_, double(p.step + 1)));
    out_.points.push_back(p);
    const bool first = out_.points.size() == 1;
    if (!std::isfinite(p.loss)) {
      control.stop_training = true;
      control.reason = fmt::format("the loss is {} at lr {:.3g} (step {})", p.loss, p.lr, p.step);
      return;
    }
    if (factor_ > 0 && !first && p.smoothed > factor_ * best_) {
      control.stop_training = true;
      control.reason = fmt::format("the smoothed loss {:.4g} passed {:g} x its best {:.4g} at lr {:.3g} (step {})",
                                   p.smoothed, factor_, best_, p.lr, p.step);
    }
    if (first || p.smoothed < best_) best_ = p.smoothed;
  }

 private:
  LrFindResult& out_;
  double beta_, factor_;
  double avg_ = 0.0, best_ = 0.0;
};

/// A double for JSON: null when not finite.
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

void suggest_lr(LrFindResult& r, std::int64_t skip_begin, std::int64_t skip_end) {
  r.suggested_lr.reset();
  r.suggested_index = -1;
  r.no_suggestion.clear();
  std::vector<double> x, y;
  std::vector<std::int64_t> at;
  const auto n = static_cast<std::int64_t>(r.points.size());
  for (std::int64_t i = std::max<std::int64_t>(0, skip_begin); i + skip_end < n; ++i) {
    const auto& p = r.points[static_cast<std::size_t>(i)];
    if (!std::isfinite(p.smoothed) || !std::isfinite(p.lr)) continue;
    x.push_back(p.lr);
    y.push_back(p.smoothed);
    at.push_back(i);
  }
  if (x.size() < 2) {
    r.no_suggestion = fmt::format(
        "{} step{} with a finite loss after the first {} and before the last {}: too few to find where the loss falls "
        "fastest (more --steps, or a lower --min-lr if the loss diverged early)",
        x.size(), x.size() == 1 ? "" : "s", skip_begin, skip_end);
    return;
  }
  // The gradient over uneven spacing, as numpy.gradient and torch.gradient take it: second order
  // inside, one-sided at the two ends.
  const std::size_t m = x.size();
  std::vector<double> g(m);
  g[0] = (y[1] - y[0]) / (x[1] - x[0]);
  g[m - 1] = (y[m - 1] - y[m - 2]) / (x[m - 1] - x[m - 2]);
  for (std::size_t i = 1; i + 1 < m; ++i) {
    const double hl = x[i] - x[i - 1], hr = x[i + 1] - x[i];
    g[i] = (hl * hl * y[i + 1] - hr * hr * y[i - 1] + (hr * hr - hl * hl) * y[i]) / (hl * hr * (hl + hr));
  }
  std::size_t best = 0;
  for (std::size_t i = 1; i < m; ++i) {
    if (g[i] < g[best]) best = i;
  }
  r.suggested_index = at[best];
  r.suggested_lr = x[best];
}

LrFindResult find_lr(const LrFindRequest& req) {
  TRAINER_CHECK_T(UsageError, req.min_lr > 0 && std::isfinite(req.max_lr) && req.max_lr > req.min_lr, "--min-lr ",
                  req.min_lr, " and --max-lr ", req.max_lr, ": the sweep needs 0 < min-lr < max-lr");
  TRAINER_CHECK_T(UsageError, req.steps >= 2, "--steps ", req.steps, ": the sweep needs at least 2 steps");
  TRAINER_CHECK_T(UsageError, req.diverge_factor == 0 || req.diverge_factor > 1, "--diverge-factor ",
                  req.diverge_factor, ": 0 (never stop early) or above 1");
  const PreparedRun prepared = prepare_run(req.recipe, req.overrides, req.plugin_dirs);

  // The recipe's run, but for the learning rate: from min_lr, times gamma every step, reaching
  // max_lr at the last; no evaluation, no checkpoint; a step per metric line.
  Config cfg = prepared.config.clone();
  const std::string origin = "trainer lr-find";
  const auto set = [&](const std::string& key, ConfigValue v) { cfg.set(key, std::move(v), origin); };
  cfg.erase("sched");
  set("sched.name", std::string("exponential"));
  set("sched.gamma", std::pow(req.max_lr / req.min_lr, 1.0 / double(req.steps - 1)));
  set("optim.lr", req.min_lr);
  set("training.max_steps", req.steps);
  // Every epoch has a step at least: this many always hold the sweep.
  set("training.epochs", std::max(cfg.get_or<std::int64_t>("training.epochs", 1), req.steps));
  set("training.log_every", std::int64_t{1});
  set("training.on_nonfinite", std::string("ignore"));  // a non-finite loss ends the sweep, not the run
  set("eval.every_epochs", std::int64_t{0});
  set("eval.every_steps", std::int64_t{0});
  set("eval.at_end", false);
  set("checkpoint.every_epochs", std::int64_t{0});
  set("checkpoint.every_steps", std::int64_t{0});
  set("checkpoint.at_end", false);
  set("checkpoint.autoresume", false);
  set("run.name", cfg.get_or<std::string>("run.name", "run") + "-lr-find");

  // Not the plugins that report or act on a finished run (Lightning's finder runs without its
  // loggers): an MLflow run of the sweep, early stopping on an evaluation it does not have.
  const auto entries = cfg.get_or<std::vector<std::string>>("plugins.load", {});
  std::vector<std::shared_ptr<Plugin>> plugins;
  std::vector<std::string> kept;
  for (std::size_t i = 0; i < prepared.plugins.size(); ++i) {
    const std::string n = prepared.plugins[i]->name();
    if (n == "mlflow" || n == "early_stopping") continue;
    plugins.push_back(prepared.plugins[i]);
    if (i < entries.size()) kept.push_back(entries[i]);
  }
  set("plugins.load", kept);

  LrFindResult out;
  out.min_lr = req.min_lr;
  out.max_lr = req.max_lr;
  out.steps = req.steps;
  plugins.push_back(std::make_shared<LrFindRecorder>(out, req.beta, req.diverge_factor));
  TrainerOptions options;
  options.config = cfg;
  options.plugins = std::move(plugins);
  options.notes = prepared.notes;
  options.run_dir = req.run_dir;
  options.log_level = req.log_level;
  options.handle_signals = true;
  const RunResult r = Trainer(std::move(options)).fit();
  out.run_dir = r.run_dir;
  out.exit_code = r.exit_code;
  out.status = r.status;
  out.message = r.message;
  if (r.stopped_by == "lr_find") {
    out.stopped = r.stop_reason;
  } else if (!r.stopped_by.empty() && r.stopped_by != "training.max_steps") {  // max_steps: the sweep's end
    out.stopped = "stopped by " + r.stopped_by + ": " + r.stop_reason;
  }
  suggest_lr(out);
  if (!out.run_dir.empty() && !out.points.empty()) {
    // Through a temporary created new: never a file or link found in the run directory.
    write_atomic(out.run_dir + "/lr_find.json", lr_find_json(out) + "\n");
  }
  return out;
}

std::string lr_find_json(const LrFindResult& r) {
  nlohmann::json j;
  j["min_lr"] = r.min_lr;
  j["max_lr"] = r.max_lr;
  j["steps"] = r.steps;
  j["suggested_lr"] = r.suggested_lr ? number(*r.suggested_lr) : nlohmann::json(nullptr);
  if (!r.no_suggestion.empty()) j["no_suggestion"] = r.no_suggestion;
  j["stopped"] = r.stopped;
  j["run_dir"] = r.run_dir;
  j["exit_code"] = r.exit_code;
  if (!r.message.empty()) j["message"] = r.message;
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : r.points) {
    points.push_back(
        {{"step", p.step}, {"lr", number(p.lr)}, {"loss", number(p.loss)}, {"smoothed", number(p.smoothed)}});
  }
  j["points"] = std::move(points);
  return j.dump();
}

void print_lr_find(const LrFindResult& r, std::ostream& out) {
  out << fmt::format("lr-find: {} of {} steps, learning rate {:g} to {:g}\n", r.points.size(), r.steps, r.min_lr,
                     r.max_lr);
  if (!r.stopped.empty()) out << "  stopped: " << r.stopped << "\n";
  if (r.suggested_lr) {
    const auto& p = r.points[static_cast<std::size_t>(r.suggested_index)];
    out << fmt::format("  suggested learning rate: {:.3g} (step {}: the smoothed loss {:.4g} falls fastest there)\n",
                       *r.suggested_lr, p.step, p.smoothed);
    out << fmt::format("  use it: optim.lr={:.3g}\n", *r.suggested_lr);
  } else {
    out << "  no suggestion: " << r.no_suggestion << "\n";
  }
  if (!r.run_dir.empty()) out << "  the curve: trainer report " << r.run_dir << "\n";
}

}  // namespace trainer::tune
