#include "sweep.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <sstream>
#include <thread>

#include "sampler.h"
#include "study.h"
#include "study_journal.h"
#include "study_mlflow.h"
#include "trainer/config_spec.h"
#include "trainer/core_settings.h"
#include "trainer/devices.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/plugin.h"
#include "trainer/recipe.h"
#include "trainer/secrets.h"

namespace trainer::tune {
namespace fs = std::filesystem;
using json = nlohmann::json;

void SweepSettings::declare(SettingsSchema<SweepSettings>& s) {
  s.add(&SweepSettings::n_trials, "n_trials", "Trials to run (skipped ones count); 0 = the grid's size, or 20").min(0);
  s.add(&SweepSettings::sampler, "sampler", "How points are picked").choices({"tpe", "random", "grid"});
  s.add(&SweepSettings::seed, "seed", "Seed of the sampler; default run.seed").min(0);
  s.add(&SweepSettings::objective, "objective", "The metric a trial is judged by: its last logged value");
  s.add(&SweepSettings::direction, "direction", "Whether a larger objective is better")
      .choices({"maximize", "minimize"});
  s.add(&SweepSettings::budget_epochs, "budget_epochs", "training.epochs of every trial; 0 = the recipe's").min(0);
  s.add(&SweepSettings::budget_steps, "budget_steps", "training.max_steps of every trial; 0 = no cap").min(0);
  s.add(&SweepSettings::pruner, "pruner", "Stops trials whose intermediate objective is poor")
      .choices({"median", "successive_halving", "none"});
  s.add(&SweepSettings::pruner_warmup, "pruner_warmup", "median: reports a trial makes before it can be pruned").min(1);
  s.add(&SweepSettings::pruner_min_trials, "pruner_min_trials",
        "median: completed trials with a report at that point before any is pruned")
      .min(1);
  s.add(&SweepSettings::reduction_factor, "reduction_factor",
        "successive_halving: 1 in this many trials goes on at each rung")
      .min(2);
  s.add(&SweepSettings::min_resource, "min_resource", "successive_halving: reports at the first rung").min(1);
  s.add(&SweepSettings::tpe_startup, "tpe_startup", "tpe: random trials before the model is used").min(1);
  s.add(&SweepSettings::parallel, "parallel",
        "Trials running at once, as processes (with device_select's leases, one per GPU)")
      .min(1);
  s.add(&SweepSettings::estimate, "estimate", "Predict each trial's memory and skip those that cannot fit");
  s.add(&SweepSettings::margin, "margin", "Fraction of the limit kept free by the prediction").min(0).max(1, false);
  s.add(&SweepSettings::dir, "dir", "Study directory; empty = <run.dir>/<run.name>-sweep");
}

std::pair<SweepSettings, SearchSpace> load_sweep(const std::string& recipe, const std::vector<std::string>& overrides) {
  const LoadedRecipe loaded = load_recipe(recipe, overrides);
  TRAINER_CHECK_T(UsageError, loaded.config.is_table("sweep"), recipe,
                  ": no [sweep] section; trainer sweep needs one (docs/sweeps.md)");
  Config c = loaded.config.clone();
  for (const auto& k : c.keys()) {
    if (k != "sweep") c.erase(k);
  }
  auto problems = validate_config(c, {SectionSpec{"sweep", SweepSettings::keys(), "The study"}}, {"sweep.space"});
  SweepSettings s;
  std::optional<SearchSpace> space;
  try {
    space = SearchSpace::from_config(c.sub("sweep.space"), "sweep.space");
  } catch (const ConfigError& e) {
    problems.insert(problems.end(), e.problems().begin(), e.problems().end());
  }
  if (!problems.empty()) throw ConfigError(problems);
  s = SweepSettings::from(c.sub("sweep"));
  if (s.sampler == "grid") {
    TRAINER_CHECK_T(UsageError, space->grid_size() > 0, c.origin("sweep.sampler"),
                    ": sweep.sampler = \"grid\" needs every parameter to be a choice or an int range");
  }
  if (s.n_trials == 0) s.n_trials = s.sampler == "grid" ? space->grid_size() : 20;
  return {s, *space};
}

StudyResult Study::run() {
  fs::create_directories(req_.study_dir + "/trials");
  StudyResult out;
  out.study_dir = req_.study_dir;
  const StudyLock lock(req_.study_dir, progress_);
  if (!lock.held()) {
    out.interrupted = true;
    return out;
  }
  start_or_resume();
  if (mlflow_.id.empty()) {
    mlflow_ = start_study_run(prepare_run(req_.recipe, req_.overrides, req_.plugin_dirs), study_name_, req_.study_dir,
                              s_, progress_);
    if (!mlflow_.id.empty()) journal_.append(mlflow_record(mlflow_));
  }
  warn_about_parallel_devices();
  sampler_ = s_.sampler == "tpe" ? tpe_sampler(TpeSettings{s_.tpe_startup}) : make_sampler(s_.sampler);
  std::vector<std::int64_t> interrupted;  // trials begun before a crash: run again, before new ones
  for (const auto& [n, t] : trials_) {
    if (t.state == TrialState::Running) interrupted.push_back(n);
  }
  std::int64_t next = trials_.empty() ? 0 : trials_.rbegin()->first + 1;
  while (!interrupt_requested()) {
    while (static_cast<std::int64_t>(running_.size()) < s_.parallel && !interrupt_requested()) {
      std::int64_t n;
      if (!interrupted.empty()) {
        n = interrupted.front();
        interrupted.erase(interrupted.begin());
      } else if (next < s_.n_trials) {
        n = next++;
        trials_[n] = TrialRecord{};
        trials_[n].number = n;
        trials_[n].state = TrialState::Running;
        trials_[n].params = propose(n);
        journal_.append(trial_record(trials_[n]));
      } else {
        break;
      }
      begin(trials_[n]);
    }
    if (running_.empty()) break;
    poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (interrupt_requested()) stop_running();
  out.interrupted = interrupt_requested();
  for (auto& [n, t] : trials_) out.trials.push_back(t);
  for (std::size_t i = 0; i < out.trials.size(); ++i) {
    const auto& t = out.trials[i];
    if (t.state != TrialState::Complete || !t.value) continue;
    if (!out.best || better(*t.value, *out.trials[*out.best].value)) out.best = static_cast<std::int64_t>(i);
  }
  write_results_csv(out, s_.objective, space_, req_.study_dir + "/results.csv");
  finish_study_run(mlflow_, out, s_.objective, progress_);
  out.mlflow_run_id = mlflow_.id;
  return out;
}

std::vector<Observation> Study::history() const {
  std::vector<Observation> h;
  for (const auto& [n, t] : trials_) {
    if (t.state == TrialState::Skipped || (t.state == TrialState::Pruned && t.out_of_memory) ||
        (t.state == TrialState::Failed && t.diverged)) {
      h.push_back({t.params.internal, 1e300});
    } else if ((t.state == TrialState::Complete || t.state == TrialState::Pruned) && t.value) {
      h.push_back({t.params.internal, loss_of(*t.value)});
    }
  }
  return h;
}

Assignment Study::propose(std::int64_t n) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed_) * 1000003ULL + static_cast<std::uint64_t>(n));
  return sampler_->sample(space_, n, history(), rng);
}

json Study::study_record() const {
  const PreparedRun base = prepare_run(req_.recipe, req_.overrides, req_.plugin_dirs);
  // The resolved config (groups, recipe, overrides; [sweep] is not in it), key by key, and
  // its content hash; as every writer writes a config: without its secrets (trainer/secrets.h).
  const Config written = redacted(base.config);
  json config = json::object();
  for (const auto& k : written.leaf_keys()) config[k] = config_value_to_toml(written.value(k));
  std::vector<std::string> overrides;
  for (const auto& o : req_.overrides) overrides.push_back(redacted_override(o));
  // The [sweep] settings besides objective, direction, sampler, seed and space (compared on
  // their own): the trials' budget, what admits a trial, and the settings of the pruner and
  // sampler in use. n_trials, parallel and dir may change.
  json settings{{"sweep.budget_epochs", s_.budget_epochs},
                {"sweep.budget_steps", s_.budget_steps},
                {"sweep.estimate", s_.estimate},
                {"sweep.margin", s_.margin},
                {"sweep.pruner", s_.pruner}};
  if (s_.pruner == "median") {
    settings["sweep.pruner_warmup"] = s_.pruner_warmup;
    settings["sweep.pruner_min_trials"] = s_.pruner_min_trials;
  } else if (s_.pruner == "successive_halving") {
    settings["sweep.reduction_factor"] = s_.reduction_factor;
    settings["sweep.min_resource"] = s_.min_resource;
  }
  if (s_.sampler == "tpe") settings["sweep.tpe_startup"] = s_.tpe_startup;
  std::error_code ec;
  fs::path recipe = fs::weakly_canonical(fs::absolute(req_.recipe), ec);
  if (ec) recipe = fs::absolute(req_.recipe).lexically_normal();
  return json{{"event", "study"},
              {"version", kStudyRecordVersion},
              {"recipe", recipe.string()},
              {"config_hash", config_hash(written.to_toml())},
              {"config", config},
              {"overrides", overrides},
              {"objective", s_.objective},
              {"direction", s_.direction},
              {"sampler", s_.sampler},
              {"seed", seed_},
              {"n_trials", s_.n_trials},
              {"settings", settings},
              {"space", space_record(space_)}};
}

void Study::start_or_resume() {
  seed_ = s_.seed
              ? *s_.seed
              : RunSettings::from(prepare_run(req_.recipe, req_.overrides, req_.plugin_dirs).config.sub("run")).seed;
  study_name_ = fs::path(req_.study_dir).filename().string();
  const json study = study_record();
  Replayed past = replay(journal_.read(), space_, journal_.path());
  if (past.study.is_null()) {
    journal_.append(study);
    return;
  }
  // A changed recipe, override, budget, pruner, sampler, objective or space would mix trials
  // of another study into this one's history (and the sampler and pruner learn from it).
  const auto differences = study_differences(past.study, study);
  TRAINER_CHECK_T(UsageError, differences.empty(), req_.study_dir, " holds a study that differs from this one (",
                  journal_.path(), "):\n  ", fmt::to_string(fmt::join(differences, "\n  ")),
                  "\na resumed study cannot change: sweep.n_trials, sweep.parallel and sweep.dir may, nothing "
                  "else; resume it as it was, or give another --study-dir");
  if (!past.study.contains("version")) {
    // An earlier trainer recorded the objective, sampler, seed, overrides and space only.
    progress_ << journal_.path()
              << " was written by an earlier trainer sweep, which did not record the resolved config, the "
                 "budget or the pruner: they cannot be checked against the trials that ran; recorded now, "
                 "later resumes check them\n";
    journal_.append(study);
  }
  trials_ = std::move(past.trials);
  mlflow_ = past.mlflow;
  // The journal names the parent run's server without credentials; the recipe's URI for the same
  // server has them.
  const std::string uri = study_tracking_uri(prepare_run(req_.recipe, req_.overrides, req_.plugin_dirs));
  if (!mlflow_.id.empty() && without_userinfo(uri) == mlflow_.tracking_uri) mlflow_.tracking_uri = uri;
  progress_ << "resuming " << journal_.path() << ": " << past.ended << " trials ended, "
            << (trials_.size() - static_cast<std::size_t>(past.ended)) << " to run again\n";
}

void Study::warn_about_parallel_devices() const {
  if (s_.parallel <= 1) return;
  const PreparedRun p = prepare_run(req_.recipe, req_.overrides, req_.plugin_dirs);
  const bool leases =
      std::any_of(p.plugins.begin(), p.plugins.end(), [](const auto& x) { return x->name() == "device_select"; });
  if (!leases && !device_inventory()->snapshot().gpus.empty()) {
    progress_ << "sweep.parallel = " << s_.parallel
              << " without the device_select plugin: every trial takes the device the recipe names; load "
                 "device_select (the robust preset has it) to give each trial a GPU of its own\n";
  }
}

std::string trial_name(std::int64_t n) {
  std::ostringstream s;
  s << "trial-" << std::setw(4) << std::setfill('0') << n;
  return s.str();
}

StudyResult run_sweep(const SweepRequest& request, std::ostream& progress) {
  auto [settings, space] = load_sweep(request.recipe, request.overrides);
  SweepRequest req = request;
  if (req.study_dir.empty()) req.study_dir = settings.dir;
  if (req.study_dir.empty()) {
    const auto run =
        RunSettings::from(prepare_run(request.recipe, request.overrides, request.plugin_dirs).config.sub("run"));
    req.study_dir = run.dir + "/" + run.name + "-sweep";
  }
  TRAINER_CHECK_T(UsageError, !req.trainer_exe.empty() && ::access(req.trainer_exe.c_str(), X_OK) == 0,
                  "cannot run the trainer executable '", req.trainer_exe, "'");
  Study study(req, settings, space, progress);
  return study.run();
}

}  // namespace trainer::tune
