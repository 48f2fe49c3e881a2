// mlflow: the run in MLflow: params (the flattened resolved config), every metric with its
// step and timestamp, tags, status and artifacts, sent to a tracking server's REST API from a
// background thread, or written in MLflow's file-store layout for `file:` URIs. Every record
// goes through the journal in RUN_DIR/mlflow first: a server that is slow or away never holds
// up a step, and what it has not acknowledged is sent when it answers, at the end of the run,
// or by `trainer mlflow sync RUN_DIR`.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>

#include "mlflow_client.h"
#include "mlflow_export.h"
#include "trainer/distributed.h"
#include "trainer/error.h"
#include "trainer/plugin.h"
#include "trainer/secrets.h"
#include "trainer/settings.h"

namespace fs = std::filesystem;
namespace mlf = trainer::mlflow;
using nlohmann::json;

namespace {

struct MlflowSettings : trainer::Settings<MlflowSettings> {
  std::string tracking_uri;
  std::string experiment;
  std::string run_name;
  std::string parent_run_id;
  std::vector<std::string> tags;
  bool log_params = true;
  bool log_config = true;
  bool log_checkpoint = false;
  double flush_interval_s = 1.0;
  double shutdown_timeout_s = 30.0;
  double max_backoff_s = 30.0;
  double request_timeout_s = 30.0;

  static void declare(trainer::SettingsSchema<MlflowSettings>& s) {
    s.add(&MlflowSettings::tracking_uri, "tracking_uri",
          "http(s)://host:port of an MLflow tracking server, or file:./mlruns (MLflow's file store); empty: "
          "$MLFLOW_TRACKING_URI")
        .memory_neutral();
    s.add(&MlflowSettings::experiment, "experiment",
          "Experiment name, created when missing; empty: $MLFLOW_EXPERIMENT_NAME, else Default")
        .memory_neutral();
    s.add(&MlflowSettings::run_name, "run_name", "MLflow run name; empty: the run directory's name").memory_neutral();
    s.add(&MlflowSettings::parent_run_id, "parent_run_id",
          "Nest the run under this MLflow run (tag mlflow.parentRunId); empty: $MLFLOW_PARENT_RUN_ID, else none")
        .memory_neutral();
    s.add(&MlflowSettings::tags, "tags", "Extra run tags, each \"key=value\"").memory_neutral();
    s.add(&MlflowSettings::log_params, "log_params", "Log the flattened resolved config as params").memory_neutral();
    s.add(&MlflowSettings::log_config, "log_config", "Upload the resolved config (config.toml) as an artifact")
        .memory_neutral();
    s.add(&MlflowSettings::log_checkpoint, "log_checkpoint",
          "Upload the run's last checkpoint as an artifact (checkpoints/<file>) when the run ends")
        .memory_neutral();
    s.add(&MlflowSettings::flush_interval_s, "flush_interval_s",
          "Longest a metric waits before it is journaled and sent (sooner at 1000 queued)")
        .min(0.01)
        .memory_neutral();
    s.add(&MlflowSettings::shutdown_timeout_s, "shutdown_timeout_s",
          "At the end of the run, how long to wait for the server to take what is queued; the rest stays in "
          "the journal for `trainer mlflow sync`")
        .min(0)
        .memory_neutral();
    s.add(&MlflowSettings::max_backoff_s, "max_backoff_s", "Longest wait between retries while the server is away")
        .min(0.5)
        .memory_neutral();
    s.add(&MlflowSettings::request_timeout_s, "request_timeout_s", "Timeout of one request (uploads: of a stall)")
        .min(1)
        .memory_neutral();
  }
};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string random_id() {
  static const char* digits = "0123456789abcdef";
  std::random_device rd;
  std::string s;
  for (int i = 0; i < 16; ++i) s += digits[rd() % 16];
  return s;
}

std::string hostname() {
  char buf[256] = {0};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string();
}

/// Forwards every metric point the run logs to the plugin.
class Sink final : public trainer::MetricSink {
 public:
  explicit Sink(std::function<void(const std::vector<trainer::MetricPoint>&)> fn) : fn_(std::move(fn)) {}
  void write(const std::vector<trainer::MetricPoint>& points) override { fn_(points); }

 private:
  std::function<void(const std::vector<trainer::MetricPoint>&)> fn_;
};

class MlflowPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "mlflow"; }
  std::string description() const override {
    return "Params, metrics, tags, status and artifacts to an MLflow tracking server (or file store), never "
           "holding up a step; what the server misses is kept in RUN_DIR/mlflow for `trainer mlflow sync`";
  }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::Init, E::Resume, E::FitStart, E::Checkpoint, E::Exception, E::Shutdown};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return MlflowSettings::keys(); }
  // What can fail here fails before training: a tracking URI that cannot be used (exit code 2),
  // a journal that cannot be created or is held by another process. A run the user asked to
  // track is not trained untracked. Once the journal is open, nothing the server does reaches
  // the run: records are queued, and send failures stay in the sender.
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }

  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = MlflowSettings::from(section);
    uri_ = s_.tracking_uri.empty() ? env_or("MLFLOW_TRACKING_URI", "") : s_.tracking_uri;
    // The URI as written anywhere (journal, state, logs): without the credentials it may hold,
    // which reach the server only (open_backend).
    shown_uri_ = trainer::without_userinfo(uri_);
    TRAINER_CHECK_T(trainer::UsageError, !uri_.empty(),
                    "plugins.mlflow.tracking_uri is empty and MLFLOW_TRACKING_URI is not set: give an MLflow "
                    "tracking server (http://host:5000) or a file store (file:./mlruns)");
    TRAINER_CHECK_T(trainer::UsageError,
                    uri_.rfind("http://", 0) == 0 || uri_.rfind("https://", 0) == 0 || uri_.rfind("file:", 0) == 0,
                    "plugins.mlflow.tracking_uri = '", shown_uri_,
                    "' is not supported: use http://host:port, https://..., or file:./mlruns");
    refuse_credentials_for_a_stored_uri(section);
    experiment_ = s_.experiment.empty() ? env_or("MLFLOW_EXPERIMENT_NAME", "Default") : s_.experiment;
    parent_ = s_.parent_run_id.empty() ? env_or("MLFLOW_PARENT_RUN_ID", "") : s_.parent_run_id;
    for (const auto& t : s_.tags) {
      const auto eq = t.find('=');
      TRAINER_CHECK_T(trainer::UsageError, eq != std::string::npos && eq > 0, "plugins.mlflow.tags: '", t,
                      "' is not \"key=value\"");
      // A tag named like a secret is not sent (nor journaled); a URI in a value loses its credentials.
      if (!trainer::is_secret_key(t.substr(0, eq))) {
        extra_tags_.push_back({t.substr(0, eq), trainer::without_userinfo(t.substr(eq + 1))});
      }
    }
  }

  void save_state(trainer::PluginState& state) override {
    state.set_string("tracking_uri", mlf::canonical_uri(shown_uri_));
    state.set_string("run_dir", run_dir_);
  }
  void load_state(const trainer::PluginState& state) override {
    resumed_uri_ = trainer::without_userinfo(state.get_string("tracking_uri"));  // an older trainer kept it whole
    resumed_run_dir_ = state.get_string("run_dir");
  }

  /// The run directory the loaded checkpoint is in (RUN/checkpoints/step_N.pt): where its
  /// journal and sent.json are, wherever the user moved it. The directory the checkpoint's
  /// state names came with the file (it may come from someone else): it is only compared.
  std::string previous_run_dir() const {
    fs::path dir = fs::absolute(resumed_checkpoint_).lexically_normal().parent_path();
    if (dir.filename() == "checkpoints") dir = dir.parent_path();
    std::error_code ec;
    if (!fs::exists(mlf::journal_dir(dir.string()) / "journal.jsonl", ec)) {
      logger_->warn(
          "mlflow: the checkpoint {} is not in a run directory with an MLflow journal ({} has none): this run starts "
          "a new MLflow run; to continue a run's, resume from its run directory or a checkpoint in its checkpoints/",
          resumed_checkpoint_, dir.string());
    } else if (!fs::equivalent(dir, resumed_run_dir_, ec)) {
      logger_->info("mlflow: the checkpoint was written in {}; its run's journal is read where it was loaded from, {}",
                    resumed_run_dir_, dir.string());
    }
    return dir.string();
  }

  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    // A data-parallel run is one MLflow run: rank 0's, whose metrics are the run's.
    if (trainer::rank_of_this_process() != 0) return;
    switch (ctx.event) {
      case trainer::Event::Init:
        open(ctx);
        break;
      case trainer::Event::Resume:
        if (ctx.resume) resumed_checkpoint_ = ctx.resume->checkpoint;
        break;
      case trainer::Event::FitStart:
        start(ctx);
        break;
      case trainer::Event::Checkpoint:
        last_checkpoint_ = ctx.checkpoint_path;
        break;
      case trainer::Event::Exception:
        if (!started_) start(ctx);  // a run that failed before training is shown too
        error_ = trainer::without_userinfo(describe(ctx.exception));
        break;
      case trainer::Event::Shutdown:
        finish(ctx);
        break;
      default:
        break;
    }
  }

 private:
  MlflowSettings s_;
  std::string uri_;        ///< as given, with any credentials: only open_backend() reads it
  std::string shown_uri_;  ///< without credentials: what is written and logged
  std::string experiment_, parent_, run_dir_;
  std::vector<mlf::KeyValue> extra_tags_;
  std::string resumed_uri_, resumed_run_dir_;
  std::string resumed_checkpoint_;  ///< the file --resume loaded
  std::unique_ptr<mlf::Exporter> exporter_;
  std::shared_ptr<Sink> sink_;
  bool started_ = false, finished_ = false;
  std::vector<mlf::Metric> before_start_;  ///< points logged before FitStart (memory at ModelToDevice)
  std::mutex mu_;                          ///< sink (training thread) vs events
  std::set<std::string> reported_;         ///< keys already reported as changed
  std::string last_checkpoint_, error_;

  static std::string describe(const std::exception_ptr& e) {
    if (!e) return {};
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    } catch (...) {
      return "unknown exception";
    }
  }

  /// A server that only a run directory's config.toml names (`--resume RUN_DIR`: the core marks
  /// its keys' origins " (a stored config)") gets no credentials from the environment: whoever
  /// could edit the directory would receive them. The user names it again: on the command line,
  /// or as MLFLOW_TRACKING_URI, as `trainer mlflow sync` asks.
  void refuse_credentials_for_a_stored_uri(const trainer::Config& section) const {
    if (s_.tracking_uri.empty() || uri_.rfind("file:", 0) == 0) return;
    if (section.origin("tracking_uri").find(" (a stored config)") == std::string::npos) return;
    const mlf::Credentials c = mlf::Credentials::from_env();
    if (c.token.empty() && c.username.empty() && c.password.empty()) return;
    const std::string env_uri = env_or("MLFLOW_TRACKING_URI", "");
    if (!env_uri.empty() && mlf::canonical_uri(env_uri) == mlf::canonical_uri(uri_)) return;
    throw trainer::UsageError(
        section.origin("tracking_uri") + ": plugins.mlflow.tracking_uri = '" + shown_uri_ +
        "' is named by the run directory alone, and MLflow credentials are set in the environment: they go only "
        "to a server you name, as a run directory may name any. Name it again: plugins.mlflow.tracking_uri=" +
        shown_uri_ + " on the command line, or MLFLOW_TRACKING_URI=" + shown_uri_);
  }

  void open(trainer::EventContext& ctx) {
    run_dir_ = fs::absolute(ctx.run_dir).string();
    auto abort = std::make_shared<std::atomic<bool>>(false);
    mlf::HttpOptions http;
    http.request_timeout_s = s_.request_timeout_s;
    http.abort = [abort] { return abort->load(); };
    std::unique_ptr<mlf::Backend> backend;
    try {
      backend = mlf::open_backend(uri_, mlf::Credentials::from_env(), http);
    } catch (const std::invalid_argument& e) {
      throw trainer::UsageError(std::string("plugins.mlflow: ") + e.what());
    }
    mlf::ExportOptions o;
    o.flush_interval_s = s_.flush_interval_s;
    o.max_backoff_s = s_.max_backoff_s;
    o.background = uri_.rfind("file:", 0) != 0;  // a file store is written at each step, on the spot
    o.abort = abort;
    exporter_ = std::make_unique<mlf::Exporter>(std::move(backend), run_dir_, o, logger_);
    sink_ = std::make_shared<Sink>([this](const std::vector<trainer::MetricPoint>& points) { on_points(points); });
    ctx.metrics->add_sink(sink_);
  }

  /// A key MLflow accepts; a changed one is reported once.
  std::string key(const std::string& k, const char* what) {
    const std::string fixed = mlf::sanitize_key(k);
    if (fixed != k && reported_.insert(k).second) {
      logger_->warn(
          "mlflow: {} key '{}' is not valid in MLflow (1-{} characters of letters, digits, _ - . space : /, "
          "a path without empty, . or .. parts); logged as '{}'",
          what, k, mlf::kMaxKeyLength, fixed);
    }
    return fixed;
  }

  std::string value(const std::string& k, std::string v, std::size_t limit, const char* what) {
    if (v.size() <= limit) return v;
    logger_->warn("mlflow: {} '{}' is {} characters, MLflow keeps {}: logged cut to {}{}", what, k, v.size(), limit,
                  limit,
                  s_.log_config && std::string(what) == "param" ? " (config.toml, an artifact, has it whole)" : "");
    v.resize(limit);
    return v;
  }

  void on_points(const std::vector<trainer::MetricPoint>& points) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    std::vector<mlf::Metric> ms;
    ms.reserve(points.size());
    for (const auto& p : points) {
      ms.push_back({key(p.name, "metric"), p.value, static_cast<std::int64_t>(p.time * 1000.0), p.step});
    }
    if (!started_) {
      before_start_.insert(before_start_.end(), ms.begin(), ms.end());
      return;
    }
    exporter_->metrics(std::move(ms));
  }

  void start(trainer::EventContext& ctx) {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_ || !exporter_) return;
    started_ = true;
    const std::string run_name = s_.run_name.empty() ? fs::path(run_dir_).filename().string() : s_.run_name;
    std::vector<mlf::KeyValue> tags{{"mlflow.runName", run_name},        {"mlflow.user", mlf::current_user()},
                                    {"mlflow.source.name", "trainer"},   {"mlflow.source.type", "LOCAL"},
                                    {"trainer.run_dir", run_dir_},       {"trainer.host", hostname()},
                                    {"trainer.device", ctx.device.str()}};
    if (!parent_.empty()) tags.push_back({"mlflow.parentRunId", parent_});
    for (const auto& t : extra_tags_) tags.push_back(t);
    json tag_list = json::array();
    for (const auto& t : tags) {
      const std::string k = key(t.key, "tag");
      tag_list.push_back(json::array({k, value(k, t.value, mlf::kMaxTagValueLength, "tag")}));
    }
    const bool resuming =
        !resumed_checkpoint_.empty() && !resumed_uri_.empty() && resumed_uri_ == mlf::canonical_uri(shown_uri_);
    json rec{{"op", resuming ? "continue" : "start"},
             {"tracking_uri", mlf::canonical_uri(shown_uri_)},
             {"experiment", experiment_},
             {"run_name", run_name},
             {"user", mlf::current_user()},
             {"start_time", mlf::now_ms()},
             {"tags", tag_list},
             {"journal_id", random_id()}};
    std::string previous;
    if (resuming) {
      previous = previous_run_dir();
      rec["previous_run_dir"] = previous;
    }
    exporter_->record(rec);
    if (resuming) logger_->info("mlflow: this resumed run continues the MLflow run of {}", previous);
    if (s_.log_params && !resuming) {
      json params = json::array();
      auto flush = [&] {
        if (!params.empty()) exporter_->record({{"op", "batch"}, {"params", params}});
        params = json::array();
      };
      const trainer::Config written = trainer::redacted(*ctx.config);  // no secrets
      for (const auto& k : written.leaf_keys()) {
        const trainer::ConfigValue& v = written.value(k);
        std::string text =
            std::holds_alternative<std::string>(v) ? std::get<std::string>(v) : trainer::config_value_to_toml(v);
        const std::string pk = key(k, "param");
        params.push_back(json::array({pk, value(pk, text, mlf::kMaxParamValueLength, "param")}));
        if (params.size() == mlf::kMaxParamsTagsPerBatch) flush();
      }
      flush();
    }
    if (s_.log_config && fs::exists(fs::path(run_dir_) / "config.toml")) {
      const std::string as =
          resuming ? "config_resumed_at_step_" + std::to_string(ctx.state.global_step) + ".toml" : "config.toml";
      exporter_->record({{"op", "artifact"}, {"file", "config.toml"}, {"path", as}});
    }
    if (!before_start_.empty()) exporter_->metrics(std::move(before_start_));
    before_start_.clear();
  }

  void finish(trainer::EventContext& ctx) {
    if (!exporter_) return;
    ctx.metrics->flush();  // the last group of points reaches the sink before the run is closed
    // MLflow's run statuses have the same names; a run still Running here (an event fired out
    // of order) ends as FAILED.
    const trainer::RunStatus ended = ctx.status;
    const std::string status = trainer::run_status_name(
        ended == trainer::RunStatus::Finished || ended == trainer::RunStatus::Killed ? ended
                                                                                     : trainer::RunStatus::Failed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_ || finished_) return;
      finished_ = true;
      json tags = json::array();
      if (!error_.empty())
        tags.push_back(json::array({"trainer.error", value("trainer.error", error_, mlf::kMaxTagValueLength, "tag")}));
      tags.push_back(json::array({"trainer.status", trainer::run_status_name(ctx.status)}));
      exporter_->record({{"op", "batch"}, {"tags", tags}});
      if (s_.log_checkpoint && !last_checkpoint_.empty() && fs::exists(last_checkpoint_)) {
        // Relative to the run directory (where checkpoints are): a copied run directory still
        // names it, and `trainer mlflow sync` sends only files inside the run directory.
        const fs::path absolute = fs::absolute(last_checkpoint_);
        const fs::path relative = absolute.lexically_relative(run_dir_);
        const bool inside = !relative.empty() && *relative.begin() != "..";
        exporter_->record({{"op", "artifact"},
                           {"file", inside ? relative.string() : absolute.string()},
                           {"path", "checkpoints/" + fs::path(last_checkpoint_).filename().string()}});
      }
      exporter_->record({{"op", "end"}, {"status", status}, {"end_time", mlf::now_ms()}});
    }
    const std::int64_t left = exporter_->close(s_.shutdown_timeout_s);
    if (left > 0) {
      logger_->warn(
          "mlflow: {} records could not be sent to {} within {} s; they are kept in {}: send them with "
          "`trainer mlflow sync {}`",
          left, shown_uri_, s_.shutdown_timeout_s, (mlf::journal_dir(run_dir_) / "journal.jsonl").string(), run_dir_);
    } else {
      logger_->info("mlflow: run {} sent to {}", status, shown_uri_);
    }
    exporter_.reset();
  }
};

}  // namespace

TRAINER_PLUGIN(MlflowPlugin)
