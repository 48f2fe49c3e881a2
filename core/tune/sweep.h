#pragma once
// `trainer sweep`: a hyperparameter study over the recipe's [sweep] section. Each trial is the
// recipe with the sampled overrides, run as its own `trainer` process (so memory is clean for
// the next one) in STUDY/trials/trial-NNNN:
//
//   1. sample     the sampler (grid, random, TPE) proposes a point of [sweep.space]
//   2. estimate   `trainer estimate` predicts the step's memory; a point predicted not to fit
//                 the budget or the device is recorded SKIPPED and costs no training
//   3. run        the trial trains for the study's budget (epochs or steps); each value of the
//                 objective metric it logs is an intermediate report, and the pruner (median,
//                 successive halving) may stop it (SIGINT: it stops at a safe point) -> PRUNED
//   4. record     COMPLETE with its last objective value; out of memory beyond what oom_backoff
//                 could fix -> PRUNED with the OOM's config and phase; anything else -> FAILED
//
// Everything is appended to STUDY/study.jsonl as it happens; a study started again with the
// same directory resumes from it, re-running only trials that had not ended. STUDY/results.csv
// holds one row per trial. With the mlflow plugin in the recipe, the study is an MLflow parent
// run and each trial a nested run.
#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "search_space.h"
#include "trainer/settings.h"
#include "trial_state.h"

namespace trainer::tune {

/// The [sweep] section (besides [sweep.space]).
struct SweepSettings : Settings<SweepSettings> {
  std::int64_t n_trials = 0;
  std::string sampler = "tpe";
  std::optional<std::int64_t> seed;
  std::string objective = "eval/accuracy";
  std::string direction = "maximize";
  std::int64_t budget_epochs = 0;
  std::int64_t budget_steps = 0;
  std::string pruner = "median";
  std::int64_t pruner_warmup = 1;
  std::int64_t pruner_min_trials = 3;
  std::int64_t reduction_factor = 3;
  std::int64_t min_resource = 1;
  std::int64_t tpe_startup = 10;
  std::int64_t parallel = 1;
  bool estimate = true;
  double margin = 0.10;
  std::string dir;

  static void declare(SettingsSchema<SweepSettings>& s);
};

struct SweepRequest {
  std::string recipe;
  std::vector<std::string> overrides;  ///< applied to every trial, before its own
  std::vector<std::string> plugin_dirs;
  std::string study_dir;    ///< --study-dir; empty: sweep.dir, else <run.dir>/<run.name>-sweep
  std::string trainer_exe;  ///< the `trainer` executable trials and estimates run
};

/// One trial as recorded.
struct TrialRecord {
  std::int64_t number = 0;
  Assignment params;
  TrialState state = TrialState::Running;
  std::string reason;  ///< why it was pruned, failed or skipped
  bool out_of_memory = false;
  bool diverged = false;             ///< FAILED: its objective or its training went NaN or infinite
  std::optional<double> value;       ///< the objective: the last value the trial logged
  std::vector<double> intermediate;  ///< every value of the objective, in order
  double seconds = 0;
  std::string run_dir;
  /// Out of memory: what ran out (model, batch_size, micro_batch_size, effective batch, image
  /// size where the dataset has one, phase).
  std::map<std::string, std::string> oom;
  std::int64_t predicted_peak = -1;  ///< bytes, when estimated
};

struct StudyResult {
  std::string study_dir;
  std::vector<TrialRecord> trials;   ///< by number
  std::optional<std::int64_t> best;  ///< index into trials of the best COMPLETE trial
  std::string mlflow_run_id;         ///< the parent run, when the recipe logs to MLflow
  bool interrupted = false;
  std::int64_t count(TrialState state) const;
  std::int64_t out_of_memory() const;
};

/// Reads [sweep] of `recipe` with `overrides`: settings and space (ConfigError listing every
/// problem, with file:line).
std::pair<SweepSettings, SearchSpace> load_sweep(const std::string& recipe, const std::vector<std::string>& overrides);

/// Runs (or resumes) the study; progress lines go to `progress`. Stops early when SIGINT/SIGTERM
/// arrive (interrupt_requested()): trials that had ended (or that the pruner was stopping) are
/// recorded as they ended, the trials it stops are not (a resume runs them again). A resume
/// whose recipe, overrides or [sweep] settings differ from the journal's is a UsageError
/// naming each difference; so is a journal record that is not as trainer sweep writes it.
StudyResult run_sweep(const SweepRequest& request, std::ostream& progress);

/// Writes the study's table: one row per trial (number, state, objective, each parameter,
/// out_of_memory, oom_phase, predicted_peak_mib, seconds, reason), through `<path>.tmp` and a
/// rename, so that it is whole; rewritten from the journal at each end of the study process.
void write_results_csv(const StudyResult& r, const std::string& objective, const SearchSpace& space,
                       const std::string& path);

/// "trial-0007": the name of trial 7's run directory, MLflow run and progress lines.
std::string trial_name(std::int64_t n);

/// The summary `trainer sweep` prints at the end.
void print_study(const StudyResult& r, const std::string& objective, std::ostream& out);

}  // namespace trainer::tune
