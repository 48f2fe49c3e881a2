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
#include "trainer/durable_file.h"

namespace trainer::tune {

/// One whole line of the journal as read back.
struct JournalLine {
  std::int64_t line = 0;    ///< 1-based, for messages
  nlohmann::json record;    ///< null when the line is not JSON
  std::string parse_error;  ///< why it is not JSON; "" when it is
};

/// How deep a record's arrays and objects may nest when read back (the study's own nest 6 deep).
inline constexpr std::int64_t kMaxRecordNesting = 64;

/// Every event of a study as one JSON line, each made durable (fsync) before the study goes
/// on. A study killed at any moment keeps every line it wrote whole: a line cut short (a kill
/// or a full disk in the middle of a write) is dropped before the next append and skipped
/// when read, so it never swallows the line after it.
class StudyJournal {
 public:
  explicit StudyJournal(std::string path) : path_(std::move(path)) {}
  /// Appends `record`; throws trainer::Error naming the file when it cannot be written.
  void append(const nlohmann::json& record);
  /// The whole lines written so far, in order, empty lines left out; a last line without its
  /// newline (cut short) is not one of them. A line that is not JSON, or whose arrays and objects
  /// nest deeper than kMaxRecordNesting, is returned with its parse_error: replay() names it.
  std::vector<JournalLine> read() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool tail_checked_ = false;
};

// The records, one per event:
//   {"event":"study", version, recipe, config_hash, config, overrides, objective, direction,
//    sampler, seed, n_trials, settings, space}            what a resume must find unchanged
//   (a journal of an earlier trainer has no version, config_hash, config nor settings)
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

/// The version of the study record this trainer writes (absent in an earlier trainer's).
inline constexpr std::int64_t kStudyRecordVersion = 2;

/// What a journal says, read in order.
struct Replayed {
  nlohmann::json study;  ///< the (last) study record; null when the journal has none (a new study)
  StudyRun mlflow;
  /// Every trial sampled: as it ended, or RUNNING (begun, not ended: its reports are dropped,
  /// it starts over).
  std::map<std::int64_t, TrialRecord> trials;
  std::int64_t ended = 0;
};

// Reading it back (study_record_check.cpp; the study records compared in study_differences.cpp): each record checked,
// and the study record compared with this study's.

/// Replays the journal at `path` (named in messages). The journal is untrusted input (a study
/// directory may come from anyone): every record is checked before it is used (JSON, a known
/// event, each field it needs there and of its type, a trial number that a trial record
/// began, the study record first). Throws UsageError listing each bad record as
/// "<path>:<line>: <what is wrong>".
Replayed replay(const std::vector<JournalLine>& lines, const SearchSpace& space, const std::string& path);

/// Every difference between the journal's study record `past` and this study's `now` that a
/// resume must not accept, one item each: "sweep.pruner: journal has \"median\", now
/// \"none\"", "override optim.lr: journal has optim.lr=0.01, now nothing". n_trials,
/// sweep.parallel and sweep.dir may change (also as overrides). A record of an earlier trainer
/// (no version) is compared on what it holds: objective, direction, sampler, seed, overrides
/// and space. Empty when nothing differs.
std::vector<std::string> study_differences(const nlohmann::json& past, const nlohmann::json& now);

/// Whether the override `text` sets a [sweep] key a resumed study may change: sweep.n_trials,
/// sweep.parallel, sweep.dir.
bool resume_may_change(const std::string& override_text);

/// The content hash of a resolved config's TOML text: "fnv1a64:<16 hex digits>".
std::string config_hash(const std::string& toml_text);

/// STUDY/study.lock, held (flock) by a study process and inherited by the trials and estimates
/// it starts, so that it is released only when all of them are gone.
class StudyLock {
 public:
  /// Takes the lock. Another live `trainer sweep` on the directory: UsageError naming its
  /// pid. Only the processes of a study that died hold it (its trials got SIGTERM and stop at a
  /// safe point): waits for them, saying so on `progress`, unless interrupted (held() false).
  StudyLock(const std::string& study_dir, std::ostream& progress);
  StudyLock(const StudyLock&) = delete;
  StudyLock& operator=(const StudyLock&) = delete;
  bool held() const { return held_; }

 private:
  FileDescriptor fd_;  ///< closed when this goes, or when the constructor throws
  bool held_ = false;
};

}  // namespace trainer::tune
