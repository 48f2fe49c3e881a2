#include "sweep.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "admission.h"
#include "bench_suite.h"
#include "estimate.h"
#include "pruner.h"
#include "sampler.h"
#include "study_journal.h"
#include "study_mlflow.h"
#include "trainer/config_spec.h"
#include "trainer/core_settings.h"
#include "trainer/devices.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/memory.h"
#include "trainer/plugin.h"
#include "trainer/recipe.h"
#include "trainer/run_records.h"
#include "trial_outcome.h"
#include "trial_process.h"

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

namespace {

struct Running {
  TrialRecord rec;
  pid_t pid = -1;
  std::chrono::steady_clock::time_point start;
  std::streamoff metrics_offset = 0;
  std::string prune_reason;      ///< set when the pruner stopped it
  std::size_t pruned_at = 0;     ///< the report it was pruned at
  std::string diverged;          ///< set when it reported a value that is not finite
  std::optional<int> exit_code;  ///< set once it has ended (and been reaped: its pid is no longer its)
};

/// The study's state and the steps of a trial's life.
class Study {
 public:
  Study(const SweepRequest& req, SweepSettings s, SearchSpace space, std::ostream& progress)
      : req_(req),
        s_(std::move(s)),
        space_(std::move(space)),
        progress_(progress),
        journal_(req.study_dir + "/study.jsonl") {}

  StudyResult run() {
    fs::create_directories(req_.study_dir + "/trials");
    StudyResult out;
    out.study_dir = req_.study_dir;
    const StudyLock lock(req_.study_dir, progress_);
    if (!lock.held()) {
      out.interrupted = true;
      return out;
    }
    resume();
    if (mlflow_.id.empty()) {
      mlflow_ = start_study_run(prepare_run(req_.recipe, req_.overrides, req_.plugin_dirs), study_name_, req_.study_dir,
                                s_, progress_);
      if (!mlflow_.id.empty()) journal_.append(mlflow_record(mlflow_));
    }
    warn_about_parallel_devices();
    sampler_ = s_.sampler == "tpe" ? tpe_sampler(TpeSettings{s_.tpe_startup}) : make_sampler(s_.sampler);
    std::vector<std::int64_t> todo;  // trials begun before a crash, then new ones
    for (const auto& [n, t] : trials_) {
      if (t.state == TrialState::Running) todo.push_back(n);
    }
    std::int64_t next = trials_.empty() ? 0 : trials_.rbegin()->first + 1;
    while (!interrupt_requested()) {
      while (static_cast<std::int64_t>(running_.size()) < s_.parallel && !interrupt_requested()) {
        std::int64_t n;
        if (!todo.empty()) {
          n = todo.front();
          todo.erase(todo.begin());
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

 private:
  bool better(double a, double b) const { return s_.direction == "maximize" ? a > b : a < b; }
  double loss_of(double v) const { return s_.direction == "maximize" ? -v : v; }

  /// The ended trials as the sampler sees them: skipped, out-of-memory and diverged trials as
  /// the worst, so that it learns to avoid what does not fit or does not train; a pruned trial
  /// by the report it was judged by.
  std::vector<Observation> history() const {
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

  Assignment propose(std::int64_t n) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed_) * 1000003ULL + static_cast<std::uint64_t>(n));
    return sampler_->sample(space_, n, history(), rng);
  }

  std::vector<std::string> trial_overrides(const TrialRecord& t) const {
    std::vector<std::string> o = req_.overrides;
    for (const auto& x : t.params.overrides()) o.push_back(x);
    if (s_.budget_epochs > 0) o.push_back("training.epochs=" + std::to_string(s_.budget_epochs));
    if (s_.budget_steps > 0) o.push_back("training.max_steps=" + std::to_string(s_.budget_steps));
    // A trial stopped by its step budget in the middle of an epoch is evaluated all the same:
    // the objective is the model it ends with.
    o.push_back("eval.at_end=true");
    if (!mlflow_.id.empty()) {
      // Quoted: a run id of hex digits could read as a TOML number.
      o.push_back("plugins.mlflow.parent_run_id=\"" + mlflow_.id + "\"");
      o.push_back("plugins.mlflow.run_name=\"" + study_name_ + "-" + trial_name(t.number) + "\"");
    }
    return o;
  }

  /// Checks the trial's config, predicts its memory; launches it unless that says no.
  void begin(TrialRecord& t) {
    t.run_dir = req_.study_dir + "/trials/" + trial_name(t.number);
    std::error_code ec;
    fs::remove_all(t.run_dir, ec);  // a trial begun before a crash starts over
    const auto overrides = trial_overrides(t);
    TrialShape shape;
    try {
      const PreparedRun p = prepare_run(req_.recipe, overrides, req_.plugin_dirs);
      const auto ts = TrainingSettings::from(p.config.sub("training"));
      shape.batch = ts.batch_size;
      shape.micro = ts.micro_batch();
      const auto es = EvalSettings::from(p.config.sub("eval"));
      shape.eval_batch = es.every_epochs > 0 || es.at_end ? es.batch_size : 0;
      shape.eval_limit_batches = es.limit_batches;
      // With oom_backoff the recipe lets the micro-batch change (gradient accumulation keeps
      // the effective batch): down to its min_micro_batch (the resolved config has its default).
      if (std::any_of(p.plugins.begin(), p.plugins.end(), [](const auto& x) { return x->name() == "oom_backoff"; })) {
        shape.backoff_floor = p.config.get<std::int64_t>("plugins.oom_backoff.min_micro_batch");
      }
    } catch (const Error& e) {
      return end(t, TrialState::Failed, std::string("config: ") + e.what());
    }
    Admission admit;
    if (s_.estimate) {
      if (const MemoryEstimate* e = estimate_for(t, overrides, shape.micro)) admit = admit_trial(*e, shape);
    }
    if (interrupt_requested()) return;  // stays RUNNING: a resumed study begins it again
    t.predicted_peak = admit.predicted_peak;
    if (!admit.run) return end(t, TrialState::Skipped, admit.reason);
    t.reason = admit.reason;
    Running r;
    r.rec = t;
    r.start = std::chrono::steady_clock::now();
    std::vector<std::string> args{req_.trainer_exe, "--recipe", req_.recipe};
    args.insert(args.end(), overrides.begin(), overrides.end());
    args.insert(args.end(), admit.overrides.begin(), admit.overrides.end());
    for (const auto& d : req_.plugin_dirs) args.insert(args.end(), {"--plugin-dir", d});
    args.insert(args.end(), {"--run-dir", t.run_dir, "--log-level", "warn"});
    fs::create_directories(t.run_dir);
    r.pid = spawn(args, t.run_dir + ".out", t.run_dir + ".out");
    progress_ << trial_name(t.number) << ": running";
    for (const auto& [k, v] : t.params.values) progress_ << " " << k << "=" << v;
    if (!t.reason.empty()) progress_ << " (" << t.reason << ")";
    progress_ << "\n";
    running_.push_back(std::move(r));
  }

  /// The memory estimate for the trial's config: `trainer estimate --json` in its own process
  /// (its probe steps leave nothing in this one). Trials that differ only in their batch sizes
  /// share it; it is probed again for a micro-batch more than 4x its largest probe. Null when
  /// the estimate failed (said once per config).
  const MemoryEstimate* estimate_for(const TrialRecord& t, const std::vector<std::string>& overrides,
                                     std::int64_t micro) {
    const std::string key = memory_key(overrides);
    if (failed_estimates_.count(key)) return nullptr;
    auto it = estimates_.find(key);
    if (it != estimates_.end()) {
      std::int64_t probed = 0;
      for (const auto& p : it->second.probes) probed = std::max(probed, p.micro_batch);
      if (micro <= 4 * probed) return &it->second;
    }
    std::vector<std::string> args{req_.trainer_exe, "estimate", "--json", "--recipe", req_.recipe};
    args.insert(args.end(), overrides.begin(), overrides.end());
    for (const auto& d : req_.plugin_dirs) args.insert(args.end(), {"--plugin-dir", d});
    args.push_back("--margin=" + std::to_string(s_.margin));
    const std::string base = req_.study_dir + "/trials/" + trial_name(t.number) + ".estimate";
    // The running trials' reports are read meanwhile: pruning and divergence do not wait.
    const int rc = wait_forwarding_interrupt(spawn(args, base + ".json", base + ".err"), [this] {
      for (auto& r : running_) read_reports(r);
    });
    if (interrupt_requested()) return nullptr;
    std::string why;
    if (rc != 0) {
      why = "estimate failed (exit " + std::to_string(rc) + "): " + last_lines(base + ".err", 2);
    } else {
      try {
        MemoryEstimate e = estimate_from_json(read_text(base + ".json"));
        if (it != estimates_.end()) {
          it->second = std::move(e);
        } else {
          it = estimates_.emplace(key, std::move(e)).first;
        }
        return &it->second;
      } catch (const Error& e) {
        why = e.what();
      }
    }
    // Not knowing is not a reason to skip: the trial runs and shows what happens.
    progress_ << trial_name(t.number) << ": " << why << "; trials of this config run unestimated\n";
    failed_estimates_.insert(key);
    return nullptr;
  }

  /// Ctrl-C or SIGTERM: the running trials (in process groups of their own) stop at a safe
  /// point. One SIGINT each: a trainer takes a second one as "stop now", without its
  /// checkpoint, so a trial the pruner or a divergence is stopping gets none. What ended before
  /// the interrupt (it exited, or the pruner or a divergence had stopped it) is recorded as it
  /// ended; a trial this stopped is not: a resumed study runs it again.
  void stop_running() {
    std::vector<bool> stopped_here;
    for (auto& r : running_) {
      if (const auto rc = poll_exit(r.pid)) {
        r.exit_code = rc;
      } else if (r.prune_reason.empty() && r.diverged.empty()) {
        ::kill(r.pid, SIGINT);
        stopped_here.push_back(true);
        continue;
      }
      stopped_here.push_back(false);
    }
    for (std::size_t i = 0; i < running_.size(); ++i) {
      Running& r = running_[i];
      if (!r.exit_code) r.exit_code = wait_exit(r.pid);
      // 0: it finished before the SIGINT reached it (an interrupted trainer exits 130).
      if (stopped_here[i] && *r.exit_code != 0) continue;
      read_reports(r);
      r.rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
      classify(r, *r.exit_code);
    }
    running_.clear();
  }

  /// New objective values of the running trials, the pruner, and the trials that ended.
  void poll() {
    for (auto it = running_.begin(); it != running_.end();) {
      Running& r = *it;
      read_reports(r);
      r.exit_code = poll_exit(r.pid);
      if (!r.exit_code) {
        ++it;
        continue;
      }
      read_reports(r);
      r.rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
      classify(r, *r.exit_code);
      it = running_.erase(it);
    }
  }

  void read_reports(Running& r) {
    std::ifstream in(r.rec.run_dir + "/metrics.jsonl");
    if (!in) return;
    in.seekg(r.metrics_offset);
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a line still being written
      r.metrics_offset = in.tellg();
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception&) {
        continue;
      }
      if (j.value("name", "") != s_.objective || !r.diverged.empty()) continue;
      const auto v = metric_value(j["value"]);
      if (!v) continue;
      if (!std::isfinite(*v)) {
        // Diverged: no later report can mean anything. The trial stops, as Optuna fails a
        // trial whose objective is not a number.
        r.diverged = s_.objective + " is " + j["value"].get<std::string>() + " at report " +
                     std::to_string(r.rec.intermediate.size() + 1) + " (diverged)";
        if (!r.exit_code) ::kill(r.pid, SIGINT);
        progress_ << trial_name(r.rec.number) << ": stopping (" << r.diverged << ")\n";
        continue;
      }
      r.rec.intermediate.push_back(*v);
      trials_[r.rec.number].intermediate = r.rec.intermediate;
      journal_.append(report_record(r.rec.number, *v));
      if (r.prune_reason.empty()) {
        const std::string why = prune_reason(s_, r.rec, trials_);
        if (!why.empty()) {
          r.prune_reason = why;
          r.pruned_at = r.rec.intermediate.size() - 1;
          if (!r.exit_code) ::kill(r.pid, SIGINT);  // it stops at its next safe point
          progress_ << trial_name(r.rec.number) << ": pruning (" << why << ")\n";
        }
      }
    }
  }

  void classify(Running& r, int rc) {
    TrialRecord& t = r.rec;
    // A trial that died before writing status.json (or wrote a damaged one) has no failure
    // kind: it is FAILED with the last lines of its output.
    std::optional<RunStatusRecord> status;
    try {
      status = decode_status(read_text(t.run_dir + "/status.json"));
    } catch (const std::exception&) {
    }
    const std::string message = status ? status->message : "";
    if (!t.intermediate.empty()) t.value = t.intermediate.back();
    if (!r.diverged.empty()) {
      t.diverged = true;
      t.value.reset();
      return end(t, TrialState::Failed, r.diverged);
    }
    if (!r.prune_reason.empty() && (rc == 130 || rc == 0)) {
      // Its value is the one it was judged by (it may log more before it stops).
      t.value = t.intermediate[r.pruned_at];
      return end(t, TrialState::Pruned, r.prune_reason);
    }
    if (rc == 0) {
      if (!t.value) {
        return end(t, TrialState::Failed,
                   "the objective metric '" + s_.objective + "' was never logged (see " + t.run_dir +
                       "/metrics.jsonl for the names)");
      }
      return end(t, TrialState::Complete, "");
    }
    if (status && status->failure == FailureKind::OutOfMemory) {
      t.out_of_memory = true;
      t.oom = oom_details(t.run_dir, *status);
      return end(t, TrialState::Pruned, message);
    }
    end(t, TrialState::Failed,
        "exit " + std::to_string(rc) + ": " + (message.empty() ? last_lines(t.run_dir + ".out", 3) : message));
  }

  void end(TrialRecord& t, TrialState state, const std::string& reason) {
    t.state = state;
    t.reason = t.reason.empty() || reason.empty() ? t.reason + reason : t.reason + "; " + reason;
    journal_.append(end_record(t));
    trials_[t.number] = t;
    progress_ << trial_name(t.number) << ": " << state;
    if (t.value) progress_ << ", " << s_.objective << " " << *t.value;
    if (!t.reason.empty()) progress_ << " (" << t.reason << ")";
    progress_ << "\n";
  }

  /// This study as the journal's study record holds it: everything a resume must find
  /// unchanged (study_differences), and n_trials.
  json study_record() const {
    const PreparedRun base = prepare_run(req_.recipe, req_.overrides, req_.plugin_dirs);
    // The resolved config (groups, recipe, overrides; [sweep] is not in it), key by key, and
    // its content hash.
    json config = json::object();
    for (const auto& k : base.config.leaf_keys()) config[k] = config_value_to_toml(base.config.value(k));
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
                {"config_hash", config_hash(base.config.to_toml())},
                {"config", config},
                {"overrides", req_.overrides},
                {"objective", s_.objective},
                {"direction", s_.direction},
                {"sampler", s_.sampler},
                {"seed", seed_},
                {"n_trials", s_.n_trials},
                {"settings", settings},
                {"space", space_record(space_)}};
  }

  /// Reads the journal of an earlier run of this study: what ended stays as it ended; what
  /// was running starts over. A study that would not be the same is refused (UsageError).
  void resume() {
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
                    journal_.path(), "):\n  ", detail::join(differences, "\n  "),
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
    progress_ << "resuming " << journal_.path() << ": " << past.ended << " trials ended, "
              << (trials_.size() - static_cast<std::size_t>(past.ended)) << " to run again\n";
  }

  /// On a GPU host, parallel trials spread over the GPUs only through device_select's leases.
  void warn_about_parallel_devices() const {
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

  const SweepRequest& req_;
  SweepSettings s_;
  SearchSpace space_;
  std::ostream& progress_;
  StudyJournal journal_;
  std::unique_ptr<Sampler> sampler_;
  std::int64_t seed_ = 0;
  std::string study_name_;
  std::map<std::int64_t, TrialRecord> trials_;
  std::vector<Running> running_;
  std::map<std::string, MemoryEstimate> estimates_;  ///< by memory_key
  std::set<std::string> failed_estimates_;
  StudyRun mlflow_;
};

}  // namespace

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
