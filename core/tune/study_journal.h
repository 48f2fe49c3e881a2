#pragma once
// Private to `trainer sweep`: the study's journal (STUDY/study.jsonl), which a study resumes
// from, and the lock that keeps one study process per study directory.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "sweep.h"

namespace trainer::tune {

/// Every event of a study as one JSON line, each made durable (fsync) before the study goes
/// on. A study killed at any moment keeps every line it wrote whole: a line cut short (a kill
/// or a full disk in the middle of a write) is dropped before the next append and skipped
/// when read, so it never swallows the line after it.
class StudyJournal {
 public:
  explicit StudyJournal(std::string path) : path_(std::move(path)) {}
  /// Appends `record`; throws trainer::Error naming the file when it cannot be written.
  void append(const nlohmann::json& record);
  /// The records written so far, in order.
  std::vector<nlohmann::json> read() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool tail_checked_ = false;
};

// The records, one per event:
//   {"event":"study", recipe, overrides, objective, direction, sampler, seed, n_trials, space}
//   {"event":"mlflow", run_id, tracking_uri}          the study's MLflow run
//   {"event":"trial", number, params, internal}       a trial sampled (before it runs)
//   {"event":"report", number, value}                 an intermediate value of its objective
//   {"event":"end", number, state, reason, value, ...} how it ended
// (keys are written sorted, so "event" comes first).

/// The parent MLflow run of a study.
struct StudyRun {
  std::string id;  ///< empty when the study has none
  std::string tracking_uri;
};

nlohmann::json space_record(const SearchSpace& space);  ///< the space as data (compared on resume)
nlohmann::json trial_record(const TrialRecord& t);
nlohmann::json report_record(std::int64_t number, double value);
nlohmann::json end_record(const TrialRecord& t);
nlohmann::json mlflow_record(const StudyRun& run);

/// What a journal says, read in order.
struct Replayed {
  nlohmann::json study;  ///< the study record; null when the journal has none (a new study)
  StudyRun mlflow;
  /// Every trial sampled: as it ended, or RUNNING (begun, not ended: its reports are dropped,
  /// it starts over).
  std::map<std::int64_t, TrialRecord> trials;
  std::int64_t ended = 0;
};
Replayed replay(const std::vector<nlohmann::json>& records, const SearchSpace& space);

/// What differs between two study records that matters to a resume ("the sampler (tpe, now
/// random)"); "" when they are the same study. n_trials may differ.
std::string study_difference(const nlohmann::json& past, const nlohmann::json& now);

/// STUDY/study.lock, held (flock) by a study process and inherited by the trials and estimates
/// it starts, so that it is released only when all of them are gone.
class StudyLock {
 public:
  /// Takes the lock. Another live `trainer sweep` on the directory: UsageError naming its
  /// pid. Only the processes of a study that died hold it (its trials got SIGTERM and stop at a
  /// safe point): waits for them, saying so on `progress`, unless interrupted (held() false).
  StudyLock(const std::string& study_dir, std::ostream& progress);
  ~StudyLock();
  StudyLock(const StudyLock&) = delete;
  StudyLock& operator=(const StudyLock&) = delete;
  bool held() const { return held_; }

 private:
  int fd_ = -1;
  bool held_ = false;
};

}  // namespace trainer::tune
