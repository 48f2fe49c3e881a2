#pragma once
// What reaches MLflow, and how nothing is lost on the way: every record of a run (its start,
// batches of metrics/params/tags, artifacts, its end) is first appended to the run
// directory's journal (RUN_DIR/mlflow/journal.jsonl), then sent in order. What the destination
// acknowledged is kept per tracking URI in RUN_DIR/mlflow/sent.json, so a record is sent once:
// after a server outage, at the end of the run or by `trainer mlflow sync`, sending resumes
// at the first record not acknowledged. (The one record in flight when a process dies may be
// sent again: MLflow stores a metric identical in key, value, step and timestamp once, and a
// param or tag set again to the same value changes nothing.)
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "journal_check.h"
#include "mlflow_client.h"
#include "trainer/durable_file.h"
#include "trainer/error.h"

namespace spdlog {
class logger;
}

namespace trainer::mlflow {

/// RUN_DIR/mlflow: the journal, sent.json, rejected.jsonl and the lock.
std::filesystem::path journal_dir(const std::string& run_dir);

/// Holds RUN_DIR/mlflow/lock (flock) while alive: one writer per journal. The kernel drops
/// the lock when its process dies, `kill -9` included: a free lock with no `end` record in
/// the journal means the run's process ended without closing it.
class JournalLock {
 public:
  /// Throws std::runtime_error naming the holder's pid when another process holds it.
  explicit JournalLock(const std::filesystem::path& dir);
  ~JournalLock();
  JournalLock(const JournalLock&) = delete;
  JournalLock& operator=(const JournalLock&) = delete;

 private:
  int fd_ = -1;
};

/// The destination's progress in a journal: where to go on, and the run it writes to.
struct Progress {
  std::int64_t seq = 0;     ///< last record acknowledged
  std::int64_t offset = 0;  ///< byte offset after it
  std::string experiment_id, run_id, artifact_uri;
};

/// Sends a journal's records to one backend, in order, from the destination's progress.
class Sender {
 public:
  Sender(Backend& backend, std::filesystem::path dir, std::shared_ptr<spdlog::logger> log);
  /// Treats the journal as untrusted (`trainer mlflow sync`): a record validate_record()
  /// refuses, an artifact outside the run directory, or a `continue` record naming a run
  /// directory other than this one and `run_dirs` throws JournalError from send_pending()
  /// (the record is not sent) instead of being kept aside. sent.json came with the journal:
  /// the run it names is looked up on the destination before the first record is sent to it,
  /// and the destination's experiment and artifact location are used, not the file's; a run
  /// the destination does not have stops sending (a RefusedError naming sent.json).
  void trust_only(std::vector<std::filesystem::path> run_dirs);
  /// Sends records until the journal's end (true) or a TransientError (false, `error` set;
  /// what was sent is kept). A record the backend refuses, or that validate_record() refuses,
  /// is reported, kept in rejected.jsonl and passed over (see trust_only()); but a refused
  /// `start` or `continue`, and a RefusedError (credentials, a 404 not from MLflow, a
  /// redirect), stop sending at that record (false, blocked() true): the records after it
  /// belong to that run, and none is marked as delivered.
  bool send_pending(std::string* error = nullptr);
  /// Whether the last send_pending() stopped at a refusal that needs a fix (its `error` says
  /// which), not at a server that did not answer.
  bool blocked() const { return blocked_; }
  /// Records in the journal after the acknowledged ones, and the metrics they hold.
  std::pair<std::int64_t, std::int64_t> pending() const;
  const Progress& progress() const { return progress_; }
  std::int64_t sent_records() const { return sent_records_; }
  std::int64_t sent_metrics() const { return sent_metrics_; }
  std::int64_t rejected_records() const { return rejected_; }

 private:
  Backend& backend_;
  std::filesystem::path dir_;
  std::shared_ptr<spdlog::logger> log_;
  Progress progress_;
  std::int64_t sent_records_ = 0, sent_metrics_ = 0, rejected_ = 0;
  nlohmann::json sent_;                         ///< sent.json as last written (null until the first write)
  bool strict_ = false;                         ///< trust_only() was called
  bool blocked_ = false;                        ///< the last send_pending() stopped at a refusal
  bool nested_ = false;                         ///< sends the journal of the run a `continue` record names, before it
  std::filesystem::path resumed_by_;            ///< nested: the run directory whose `continue` record named this one
  bool confirmed_ = false;                      ///< progress_'s run was looked up on the destination (or created there)
  std::vector<std::filesystem::path> trusted_;  ///< canonical run directories a `continue` may name

  void apply(const nlohmann::json& rec, const std::string& where);
  /// Strict or nested: looks up progress_'s run (from sent.json) on the destination, once.
  void confirm_run();
  void save_progress();
};

/// Reads RUN_DIR/mlflow/sent.json's entry for `uri` (empty Progress when none).
Progress read_progress(const std::filesystem::path& dir, const std::string& uri);

/// A tracking URI as the journal keys it: `file:` URIs made absolute (`file:///abs/path`), the
/// userinfo of others cut (`http://user:pass@host` is `http://host`: the credentials name who
/// sends, not where to).
std::string canonical_uri(const std::string& uri);

struct ExportOptions {
  double flush_interval_s = 1.0;  ///< the longest a metric waits in memory before it is journaled and sent
  double max_backoff_s = 30.0;    ///< retries after a failure wait 0.5 s, 1 s, 2 s, ... up to this
  bool background = true;         ///< false: journal and send on the caller's thread (file stores)
  /// Set when close() gives up waiting: hand the same flag to the backend's HttpOptions::abort
  /// so that a request in progress ends at once.
  std::shared_ptr<std::atomic<bool>> abort = std::make_shared<std::atomic<bool>>(false);
};

/// The plugin's side: queues records, journals them and sends them from a background thread
/// (or at once, for a file store). Thread-safe; enqueueing never blocks on I/O.
class Exporter {
 public:
  Exporter(std::unique_ptr<Backend> backend, const std::string& run_dir, ExportOptions options,
           std::shared_ptr<spdlog::logger> log);
  ~Exporter();
  /// Queues metrics (one batch record per 1000).
  void metrics(std::vector<Metric> points);
  /// Queues a record (start, continue, batch, artifact, end), after the metrics queued before.
  void record(nlohmann::json rec);
  /// Waits up to `timeout_s` for everything queued to be sent, then stops the sender (an
  /// upload in progress is abandoned). Returns the records left in the journal, unsent.
  std::int64_t close(double timeout_s);
  std::int64_t metrics_sent() const;

 private:
  std::unique_ptr<Backend> backend_;
  std::filesystem::path dir_;
  ExportOptions options_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<JournalLock> lock_;
  std::unique_ptr<Sender> sender_;
  FileDescriptor journal_fd_;  ///< the journal, opened for appending
  std::int64_t next_seq_ = 1;
  bool tail_dirty_ = false;        ///< a failed append left a partial line that could not be cut yet
  std::int64_t lost_records_ = 0;  ///< records not journaled since the last append that worked

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  struct Item {
    std::vector<Metric> metrics;
    nlohmann::json rec;  ///< null for metrics
  };
  std::deque<Item> queue_;
  std::size_t queued_metrics_ = 0;
  bool closing_ = false, stop_ = false, idle_ = true, thread_done_ = false;
  std::thread thread_;
  std::int64_t metrics_sent_ = 0;

  void run();
  /// Journals what is queued; then sends unless waiting after a failure.
  void journal(std::deque<Item>& items);
  /// Appends `rec` as one line. A write that fails (a full disk) is reported and cut back to
  /// the last complete line, so that the next record starts a line of its own; the record is lost.
  void append(nlohmann::json rec);
  bool try_send();
  bool outage_ = false;
  double backoff_s_ = 0.0;
  std::chrono::steady_clock::time_point retry_at_{};
};

/// `trainer mlflow sync RUN_DIR [PREVIOUS_RUN_DIR...] [--tracking-uri URI]`: sends what
/// RUN_DIR's journal holds that `uri` has not acknowledged. A run whose process ended without
/// closing it (kill -9, a crash) is marked FAILED.
///
/// The journal is untrusted (a run directory copied from someone else): every record is
/// checked first (validate_record, artifact_source) and nothing is sent when one fails; a
/// `continue` record not yet sent may name only RUN_DIR or one of `previous_run_dirs`. The
/// destination is `uri`, else $MLFLOW_TRACKING_URI, else the journal's; credentials
/// (MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME/PASSWORD) go only to a URI the user gave:
/// $MLFLOW_TRACKING_URI differing from the journal's, or credentials set with a URI from the
/// journal alone, are refused.
///
/// Exit code: 0 all sent, 2 usage (no journal, a trainer still writing it, a record refused,
/// a tracking URI in doubt), 3 records left: the destination could not be reached, or it
/// refused the run's start/continue or every request (credentials, a 404 not from MLflow, a
/// redirect), the message saying what to fix.
int sync_run_dir(const std::string& run_dir, const std::string& uri, std::ostream& out, std::ostream& err,
                 const std::vector<std::string>& previous_run_dirs = {});

}  // namespace trainer::mlflow
