#include "study_mlflow.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <ostream>

#include "mlflow_client.h"
#include "trainer/plugin.h"
#include "trainer/secrets.h"

namespace trainer::tune {

std::string study_tracking_uri(const PreparedRun& p) {
  // As the plugin itself resolves it: the config, else the environment.
  const char* env_uri = std::getenv("MLFLOW_TRACKING_URI");
  return p.config.get_or<std::string>("plugins.mlflow.tracking_uri", "").empty()
             ? (env_uri ? env_uri : "")
             : p.config.get<std::string>("plugins.mlflow.tracking_uri");
}

StudyRun start_study_run(const PreparedRun& p, const std::string& name, const std::string& study_dir,
                         const SweepSettings& s, std::ostream& progress) {
  StudyRun run;
  const bool used =
      std::any_of(p.plugins.begin(), p.plugins.end(), [](const auto& x) { return x->name() == "mlflow"; });
  if (!used) return run;
  const char* env_exp = std::getenv("MLFLOW_EXPERIMENT_NAME");
  const std::string uri = study_tracking_uri(p);
  const std::string exp = p.config.get_or<std::string>("plugins.mlflow.experiment", "").empty()
                              ? (env_exp ? env_exp : "Default")
                              : p.config.get<std::string>("plugins.mlflow.experiment");
  try {
    auto backend = mlflow::open_backend(uri, mlflow::Credentials::from_env());
    run.id = mlflow::start_run(*backend, exp, name, "",
                               {{"trainer.study_dir", std::filesystem::absolute(study_dir).string()},
                                {"trainer.sweep.objective", s.objective},
                                {"trainer.sweep.sampler", s.sampler}})
                 .run_id;
    run.tracking_uri = uri;
    progress << "MLflow: parent run " << run.id << " (" << without_userinfo(uri) << ", experiment " << exp << ")\n";
  } catch (const std::exception& e) {
    // The trials still log their own runs; only the nesting is lost.
    progress << "MLflow: cannot create the study's parent run (" << e.what() << "); trials log as top-level runs\n";
    run = {};
  }
  return run;
}

void finish_study_run(const StudyRun& run, const StudyResult& r, const std::string& objective, std::ostream& progress) {
  if (run.id.empty()) return;
  try {
    auto backend = mlflow::open_backend(run.tracking_uri, mlflow::Credentials::from_env());
    const std::int64_t now = mlflow::now_ms();
    std::vector<mlflow::Metric> metrics{{"study/complete", double(r.count(TrialState::Complete)), now, 0},
                                        {"study/pruned", double(r.count(TrialState::Pruned)), now, 0},
                                        {"study/failed", double(r.count(TrialState::Failed)), now, 0},
                                        {"study/skipped", double(r.count(TrialState::Skipped)), now, 0},
                                        {"study/out_of_memory", double(r.out_of_memory()), now, 0}};
    std::vector<mlflow::KeyValue> tags;
    if (r.best) {
      const auto& b = r.trials[static_cast<std::size_t>(*r.best)];
      metrics.push_back({mlflow::sanitize_key("best/" + objective), *b.value, now, 0});
      tags.push_back({"trainer.sweep.best_trial", trial_name(b.number)});
      for (const auto& [k, v] : b.params.values) tags.push_back({mlflow::sanitize_key("best." + k), v});
    }
    backend->log_batch(run.id, metrics, {}, tags);
    if (!r.interrupted) mlflow::end_run(*backend, run.id, "FINISHED");
  } catch (const std::exception& e) {
    progress << "MLflow: cannot update the study's parent run: " << e.what() << "\n";
  }
}

}  // namespace trainer::tune
