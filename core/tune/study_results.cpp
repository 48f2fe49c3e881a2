#include "sweep.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "bench_suite.h"
#include "trainer/durable_file.h"
#include "trainer/error.h"

// A study's results: the counts, results.csv, the summary printed at the end.
namespace trainer::tune {

using json = nlohmann::json;
namespace fs = std::filesystem;
constexpr std::int64_t kMiB = 1024 * 1024;

std::int64_t StudyResult::count(TrialState state) const {
  return std::count_if(trials.begin(), trials.end(), [&](const TrialRecord& t) { return t.state == state; });
}

std::int64_t StudyResult::out_of_memory() const {
  return std::count_if(trials.begin(), trials.end(), [](const TrialRecord& t) { return t.out_of_memory; });
}

void write_results_csv(const StudyResult& r, const std::string& objective, const SearchSpace& space,
                       const std::string& path) {
  std::ostringstream out;
  out << "number,state," << csv_field(objective);
  for (const auto& p : space.params()) out << "," << csv_field(p.key);
  out << ",out_of_memory,oom_phase,predicted_peak_mib,seconds,reason\n";
  for (const auto& t : r.trials) {
    out << t.number << "," << t.state << "," << (t.value ? json(*t.value).dump() : "");
    for (const auto& p : space.params()) out << "," << csv_field(t.params.get(p.key));
    out << "," << (t.out_of_memory ? "true" : "false") << "," << (t.oom.count("phase") ? t.oom.at("phase") : "") << ","
        << (t.predicted_peak >= 0 ? std::to_string(t.predicted_peak / kMiB) : "") << "," << json(t.seconds).dump()
        << "," << csv_field(t.reason) << "\n";
  }
  write_replacing(path, out.str());  // through a temporary created new: never a planted link
}

void print_study(const StudyResult& r, const std::string& objective, std::ostream& out) {
  out << "study " << r.study_dir << ": " << r.trials.size() << " trials: " << r.count(TrialState::Complete)
      << " complete, " << r.count(TrialState::Pruned) << " pruned (" << r.out_of_memory() << " out of memory), "
      << r.count(TrialState::Failed) << " failed, " << r.count(TrialState::Skipped)
      << " skipped (predicted out of memory)";
  if (r.interrupted) out << "; interrupted: run the same command again to resume";
  out << "\n";
  if (r.best) {
    const auto& b = r.trials[static_cast<std::size_t>(*r.best)];
    out << "best: " << trial_name(b.number) << ", " << objective << " " << *b.value << ":";
    for (const auto& [k, v] : b.params.values) out << " " << k << "=" << v;
    out << "\n";
  }
  out << "results: " << r.study_dir << "/results.csv\n";
  if (!r.mlflow_run_id.empty()) out << "MLflow parent run: " << r.mlflow_run_id << "\n";
}

}  // namespace trainer::tune
