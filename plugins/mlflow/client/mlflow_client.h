#pragma once
// MLflow tracking from C++: a backend per tracking URI (a server's REST API under
// /api/2.0/mlflow, or MLflow's file-store layout for `file:` URIs), MLflow's limits and key
// rules, and the nested runs a sweep opens. No LibTorch here: the `trainer` CLI links it for
// `trainer mlflow sync`.
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::mlflow {

// MLflow's limits (mlflow/utils/validation.py).
inline constexpr std::size_t kMaxMetricsPerBatch = 1000;
inline constexpr std::size_t kMaxParamsTagsPerBatch = 100;
inline constexpr std::size_t kMaxEntitiesPerBatch = 1000;
inline constexpr std::size_t kMaxKeyLength = 250;
inline constexpr std::size_t kMaxParamValueLength = 6000;
inline constexpr std::size_t kMaxTagValueLength = 8000;
inline constexpr std::size_t kMaxArtifactPathLength = 1000;

struct Metric {
  std::string key;
  double value = 0.0;
  std::int64_t timestamp_ms = 0;
  std::int64_t step = 0;
};

struct KeyValue {
  std::string key, value;
};

/// What a backend knows of a run.
struct RunInfo {
  std::string run_id;
  std::string experiment_id;
  std::string artifact_uri;
  std::string status;  ///< RUNNING, FINISHED, FAILED, KILLED, SCHEDULED
  std::int64_t end_time = 0;
};

/// A failure worth trying again later: no connection, a timeout, 429, a 5xx, refused
/// credentials (fixed by the user, then `trainer mlflow sync`).
class TransientError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The destination refused a request for a reason that is not the record's own and that
/// waiting alone will not fix: refused credentials (401/403), a 404 that is not MLflow's
/// answer (a tracking URI missing a path prefix), a redirect (3xx, not followed: credentials
/// would go along), the run's start or continue refused (a deleted experiment). Like any
/// TransientError, sending stops at the record and it stays in the journal; the message names
/// the cause and what to fix.
class RefusedError : public TransientError {
 public:
  using TransientError::TransientError;
};

/// The backend refused the request for what it holds (a 4xx other than 401/403/408/429, a
/// local file that cannot be read): sending it again cannot succeed.
class RejectedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Authentication from the standard environment: MLFLOW_TRACKING_TOKEN (bearer), else
/// MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (basic).
struct Credentials {
  std::string token, username, password;
  static Credentials from_env();
};

struct HttpOptions {
  double connect_timeout_s = 5.0;
  double request_timeout_s = 30.0;  ///< a whole request, artifact uploads excepted
  /// Polled during a transfer: returning true aborts it (a TransientError), so shutting
  /// down is never held up by a slow server.
  std::function<bool()> abort;
};

/// One tracking destination. Implementations are not thread-safe: one caller at a time.
class Backend {
 public:
  virtual ~Backend() = default;
  /// The tracking URI as given, without credentials (`http://host:5000`, `file:./mlruns`).
  virtual std::string uri() const = 0;
  /// The id of the experiment `name`, created when it does not exist.
  virtual std::string experiment_id(const std::string& name) = 0;
  virtual RunInfo create_run(const std::string& experiment_id, const std::string& run_name, const std::string& user,
                             std::int64_t start_ms, const std::vector<KeyValue>& tags) = 0;
  virtual RunInfo get_run(const std::string& run_id) = 0;
  /// The run of `experiment_id` whose tag `key` is `value`, if any (run_id empty when none).
  virtual RunInfo find_run_by_tag(const std::string& experiment_id, const std::string& key,
                                  const std::string& value) = 0;
  /// Within MLflow's per-request limits (the caller splits).
  virtual void log_batch(const std::string& run_id, const std::vector<Metric>& metrics,
                         const std::vector<KeyValue>& params, const std::vector<KeyValue>& tags) = 0;
  /// `status`: RUNNING (end time cleared where the backend allows), FINISHED, FAILED, KILLED.
  virtual void update_run(const std::string& run_id, const std::string& status, std::int64_t end_ms) = 0;
  /// Uploads the file `local_path` as the run's artifact `artifact_path` (`config.toml`,
  /// `checkpoints/step_100.pt`).
  virtual void log_artifact(const RunInfo& run, const std::string& local_path, const std::string& artifact_path) = 0;
};

/// The backend of `tracking_uri`: `http://` or `https://` (the REST API), `file:PATH` or
/// `file:///abs/path` (MLflow's file store). Throws std::invalid_argument for anything else,
/// naming the URI and what is accepted. An http(s) URI's "user:password@" authenticates (basic,
/// in place of `credentials`) and is cut from the URI the backend names (Backend::uri()), so that
/// no record or message holds it.
std::unique_ptr<Backend> open_backend(const std::string& tracking_uri, const Credentials& credentials = {},
                                      HttpOptions http = {});

// ---- MLflow's rules for keys and values ------------------------------------------------

/// Whether MLflow accepts `key` as a metric, param or tag key: 1 to 250 characters of
/// ASCII letters, digits, `_ - . space : /`, and a path that normalises to itself (no leading
/// or trailing `/`, no `//`, no `.` or `..` part).
bool valid_key(const std::string& key);
/// Whether `path` can name a run's artifact: a relative path of `/`-separated parts, none
/// of them empty, `.` or `..`, without control characters or `\`, at most 1000 characters.
/// Anything else could leave the run's artifact root.
bool valid_artifact_path(const std::string& path);
/// Whether `id` can name a run or an experiment in a file store (one directory name): 1 to 64
/// ASCII letters, digits, `_` or `-`.
bool valid_id(const std::string& id);
/// `key` made valid: each character MLflow refuses becomes `_`, empty parts of a path are
/// dropped, `.`/`..` parts become `_`/`__`, and a key longer than 250 characters keeps its
/// first 241 and a `-` and 8 hex digits of its hash. Equal to `key` when it was valid.
std::string sanitize_key(const std::string& key);

// ---- runs, for sweeps and tools ----------------------------------------------------------

/// Opens a run of experiment `experiment` (created when missing) under `parent_run_id`
/// (empty: a top-level run; else the run carries the tag mlflow.parentRunId). Its status is
/// RUNNING until end_run(); a child's status is its own.
RunInfo start_run(Backend& backend, const std::string& experiment, const std::string& run_name,
                  const std::string& parent_run_id = "", std::vector<KeyValue> tags = {});
/// Ends a run with `status` (FINISHED, FAILED, KILLED) at the current time.
void end_run(Backend& backend, const std::string& run_id, const std::string& status);

/// The user name MLflow records (`mlflow.user`): $USER, else the account's name.
std::string current_user();
/// Milliseconds since the Unix epoch.
std::int64_t now_ms();

}  // namespace trainer::mlflow
