#pragma once
// Private to `trainer sweep`: the study's state and the steps of a trial's life. sweep.cpp runs
// the study and keeps its journal; study_trials.cpp launches, reads and classifies its trials.
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <ios>
#include <iosfwd>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "estimate.h"
#include "sampler.h"
#include "study_journal.h"
#include "sweep.h"

namespace trainer::tune {

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
        journal_(req.study_dir + "/study.jsonl"),
        probe_lengths_(lengths_to_probe(space_)) {}

  /// The lengths `trainer estimate --lengths` probes for a space over dataset.max_length: its
  /// shortest, middle and longest values ("64,128,256"); empty when the space has no such
  /// parameter or fewer than three values of it (then each length is estimated on its own).
  static std::string lengths_to_probe(const SearchSpace& space);

  StudyResult run();

 private:
  // The study as a whole (sweep.cpp).

  bool better(double a, double b) const { return s_.direction == "maximize" ? a > b : a < b; }
  double loss_of(double v) const { return s_.direction == "maximize" ? -v : v; }

  /// The ended trials as the sampler sees them: skipped, out-of-memory and diverged trials as
  /// the worst, so that it learns to avoid what does not fit or does not train; a pruned trial
  /// by the report it was judged by.
  std::vector<Observation> history() const;

  Assignment propose(std::int64_t n);

  /// This study as the journal's study record holds it: everything a resume must find
  /// unchanged (study_differences), and n_trials.
  nlohmann::json study_record() const;

  /// Starts the study's journal with its study record, or, when the journal holds an earlier
  /// run of this study, resumes it: what ended stays as it ended; what was running starts over.
  /// A study that would not be the same is refused (UsageError).
  void start_or_resume();

  /// On a GPU host, parallel trials spread over the GPUs only through device_select's leases.
  void warn_about_parallel_devices() const;

  // A trial's life (study_trials.cpp).

  std::vector<std::string> trial_overrides(const TrialRecord& t) const;

  /// Checks the trial's config, predicts its memory; launches it unless that says no.
  void begin(TrialRecord& t);

  /// The memory estimate for the trial's config: `trainer estimate --json` in its own process
  /// (its probe steps leave nothing in this one). Trials that differ only in keys declared
  /// memory_neutral() (their batch sizes, the learning rate ...: the same `key`, memory_key())
  /// share it; it is probed again for a micro-batch more than 4x its largest probe (over
  /// lengths: micro-batch x `length` tokens, more than 4x a probe's). Null when the estimate
  /// failed (said once per config).
  const MemoryEstimate* estimate_for(const TrialRecord& t, const std::vector<std::string>& overrides,
                                     const std::string& key, std::int64_t micro, std::int64_t length);

  /// Ctrl-C or SIGTERM: the running trials (in process groups of their own) stop at a safe
  /// point. One SIGINT each: a trainer takes a second one as "stop now", without its
  /// checkpoint, so a trial the pruner or a divergence is stopping gets none. What ended before
  /// the interrupt (it exited, or the pruner or a divergence had stopped it) is recorded as it
  /// ended; a trial this stopped is not: a resumed study runs it again.
  void stop_running();

  /// New objective values of the running trials, the pruner, and the trials that ended.
  void poll();

  void read_reports(Running& r);

  void classify(Running& r, int rc);

  void end(TrialRecord& t, TrialState state, const std::string& reason);

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
  /// --lengths of the estimates (lengths_to_probe): one estimate covers every
  /// dataset.max_length of the space, each trial predicted at its own.
  std::string probe_lengths_;
  StudyRun mlflow_;
};

}  // namespace trainer::tune
