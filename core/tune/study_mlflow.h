#pragma once
// Private to `trainer sweep`: with the mlflow plugin in the recipe, the study is an MLflow run
// of its own and each trial a nested run under it.
#include <iosfwd>
#include <string>

#include "study_journal.h"
#include "sweep.h"
#include "trainer/recipe.h"

namespace trainer::tune {

/// The tracking URI the recipe's mlflow plugin logs to: plugins.mlflow.tracking_uri, else
/// $MLFLOW_TRACKING_URI (with any credentials it holds).
std::string study_tracking_uri(const PreparedRun& recipe);

/// Creates the study's run (named `name`, tagged with the study directory, objective and
/// sampler) on the tracking server or file store the recipe's mlflow plugin logs to. Empty when
/// the recipe does not load mlflow, or when the run cannot be created (said on `progress`: the
/// trials then log as top-level runs).
StudyRun start_study_run(const PreparedRun& recipe, const std::string& name, const std::string& study_dir,
                         const SweepSettings& s, std::ostream& progress);

/// Logs the study's counts (study/complete, study/pruned, study/failed, study/skipped,
/// study/out_of_memory), best/<objective> and the best trial's parameters as best.<key> tags;
/// ends the run FINISHED unless the study was interrupted (a resumed study finishes it).
void finish_study_run(const StudyRun& run, const StudyResult& r, const std::string& objective, std::ostream& progress);

}  // namespace trainer::tune
