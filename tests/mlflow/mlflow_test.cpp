// The mlflow plugin against a real MLflow 3.17.2 (`mlflow server` on 127.0.0.1 with SQLite and
// served artifacts, started by the CTest fixture), read back with MLflow's own Python client.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "mlflow_client.h"
#include "mlflow_export.h"
#include "support/test_util.h"

namespace {

using nlohmann::json;
using trainer::testing::Child;
using trainer::testing::read_file;
using trainer::testing::read_lines;
using trainer::testing::TempDir;
using trainer::testing::TrainerTest;
using trainer::testing::write_file;
namespace fs = std::filesystem;
namespace mlf = trainer::mlflow;

using Shell = trainer::testing::CommandOutput;

/// `cmd` through the shell, stderr with stdout.
Shell sh(const std::string& cmd) { return trainer::testing::run_command(cmd); }

const std::string kScript = TRAINER_MLFLOW_SCRIPT;
const std::string kVenv = TRAINER_MLFLOW_VENV;

std::string shared_uri() {
  const std::string port = read_file(std::string(TRAINER_MLFLOW_SERVER_DIR) + "/port");
  EXPECT_FALSE(port.empty()) << "the mlflow server fixture did not start (" << TRAINER_MLFLOW_SERVER_DIR << ")";
  return "http://127.0.0.1:" + port.substr(0, port.find('\n'));
}

json mlflow_read(const std::string& args) {
  const Shell r = sh(kVenv + "/bin/python " + TRAINER_MLFLOW_READER + " " + args);
  EXPECT_EQ(r.code, 0) << r.text;
  // The client may log warnings first: the JSON is the last line.
  const auto lines = trainer::testing::read_lines_of(r.text);
  const json j = lines.empty() ? json() : json::parse(lines.back(), nullptr, false);
  EXPECT_TRUE(j.is_object()) << r.text;
  return j;
}

/// The steps of an MLflow run's train/loss points (mlflow_read("run ...")).
std::set<long> loss_steps(const json& run) {
  std::set<long> steps;
  for (const auto& p : run["metrics"]["train/loss"]) steps.insert(p[0].get<long>());
  return steps;
}

std::string run_id_of(const std::string& run_dir, const std::string& uri) {
  return mlf::read_progress(mlf::journal_dir(run_dir), uri).run_id;
}

using Point = std::tuple<long, std::string, long>;  // step, value as text, timestamp ms

std::string value_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v.get<double>());
  return buf;
}

/// metrics.jsonl as MLflow stores it: per key the distinct (step, value, timestamp ms).
std::map<std::string, std::set<Point>> local_metrics(const std::string& run_dir) {
  std::map<std::string, std::set<Point>> out;
  for (const auto& line : read_lines(run_dir + "/metrics.jsonl")) {
    const json j = json::parse(line);
    const auto ts = static_cast<long>(j["time"].get<double>() * 1000.0);
    out[j["name"].get<std::string>()].insert({j["step"].get<long>(), value_text(j["value"]), ts});
  }
  return out;
}

/// The server's metric histories; `doubled` counts points present twice.
std::map<std::string, std::set<Point>> server_metrics(const json& run, int* doubled = nullptr) {
  std::map<std::string, std::set<Point>> out;
  for (const auto& [key, history] : run["metrics"].items()) {
    for (const auto& m : history) {
      const bool fresh = out[key].insert({m[0].get<long>(), value_text(m[1]), m[2].get<long>()}).second;
      if (!fresh && doubled) ++*doubled;
    }
  }
  return out;
}

/// Every point of metrics.jsonl is on the server, once.
void expect_same_metrics(const std::string& run_dir, const json& run) {
  int doubled = 0;
  const auto server = server_metrics(run, &doubled);
  const auto local = local_metrics(run_dir);
  EXPECT_EQ(doubled, 0);
  ASSERT_FALSE(local.empty());
  for (const auto& [key, points] : local) {
    ASSERT_TRUE(server.count(key)) << "metric " << key << " is not on the server";
    EXPECT_EQ(server.at(key), points) << "metric " << key;
  }
  EXPECT_EQ(server.size(), local.size());
}

const std::string kRun = std::string(trainer::testing::kSmallRun) + R"(
[plugins]
load = ["memory_log", "mlflow"]
)";

std::string cli_run(const std::string& recipe, const std::string& run_dir, const std::string& extra) {
  return std::string(TRAINER_CLI) + " --recipe " + recipe + " --run-dir " + run_dir + " --log-level warn " + extra +
         " > " + run_dir + ".log 2>&1";
}

/// Runs until it is signalled.
constexpr const char* kEndless =
    " training.epochs=100000 eval.every_epochs=0 eval.at_end=false checkpoint.every_epochs=0";

class Mlflow : public TrainerTest {
 protected:
  /// A unique experiment per test.
  std::string experiment() const {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::string("trainer-test ") + info->name() + " " + std::to_string(::getpid());
  }
  std::vector<std::string> mlflow_overrides(const std::string& uri) const {
    return {"+plugins.mlflow.tracking_uri=\"" + uri + "\"", "+plugins.mlflow.experiment=\"" + experiment() + "\""};
  }
  trainer::RunResult train(const std::string& uri, std::vector<std::string> overrides, const std::string& name,
                           const std::vector<std::shared_ptr<trainer::Plugin>>& extra = {}) {
    auto o = mlflow_overrides(uri);
    o.insert(o.end(), overrides.begin(), overrides.end());
    trainer::Trainer t(options_for(kRun, o, name, extra));
    return t.fit();
  }
  /// The command line of the trainer CLI training kRun in <tmp>/<name>, sending to `uri` (its
  /// output in <tmp>/<name>.log).
  std::string cli_command(const std::string& uri, const std::string& name, const std::string& extra) {
    write_file(tmp_ / "recipe.toml", kRun);
    std::string args;
    for (const auto& o : mlflow_overrides(uri)) args += " '" + o + "'";
    return cli_run(tmp_ / "recipe.toml", tmp_ / name, args + " +plugins.mlflow.flush_interval_s=0.05 " + extra);
  }
};

/// Logs NaN, ±inf and a key MLflow refuses at every step.
class OddValues final : public trainer::Plugin {
 public:
  std::string name() const override { return "odd_values"; }
  std::vector<trainer::Event> events() const override { return {trainer::Event::BatchEnd}; }
  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    ctx.metrics->log(ctx.state.global_step, {{"odd/nan", std::nan("")},
                                             {"odd/inf", std::numeric_limits<double>::infinity()},
                                             {"odd/-inf", -std::numeric_limits<double>::infinity()},
                                             {"odd|bad key", 1.5}});
  }
};

TEST_F(Mlflow, AFinishedRunHasEveryParamMetricTagAndArtifact) {
  const std::string uri = shared_uri();
  const auto r = train(uri, {"+plugins.mlflow.tags=[\"team=vision\"]"}, "run");
  ASSERT_EQ(r.status, trainer::RunStatus::Finished) << r.message;
  const std::string id = run_id_of(r.run_dir, uri);
  ASSERT_FALSE(id.empty());
  const json run = mlflow_read("run " + uri + " " + id);
  EXPECT_EQ(run["info"]["status"], "FINISHED");
  EXPECT_GT(run["info"]["end_time"].get<long>(), run["info"]["start_time"].get<long>());
  EXPECT_EQ(run["info"]["run_name"], "run");
  // Every leaf of the resolved config, with its value.
  const auto config = trainer::Config::parse_file(r.run_dir + "/config.toml");
  const auto leaves = config.leaf_keys();
  EXPECT_EQ(run["params"].size(), leaves.size());
  EXPECT_EQ(run["params"]["training.batch_size"], "32");
  EXPECT_EQ(run["params"]["model.name"], "mlp");
  EXPECT_EQ(run["params"]["optim.lr"], trainer::config_value_to_toml(config.value("optim.lr")));
  for (const auto& k : leaves) EXPECT_TRUE(run["params"].contains(k)) << k;
  // Tags.
  const json& tags = run["tags"];
  EXPECT_EQ(tags["mlflow.runName"], "run");
  EXPECT_EQ(tags["mlflow.source.type"], "LOCAL");
  EXPECT_EQ(tags["team"], "vision");
  EXPECT_EQ(tags["trainer.run_dir"], fs::absolute(r.run_dir).string());
  EXPECT_EQ(tags["trainer.status"], "FINISHED");
  EXPECT_FALSE(tags.contains("mlflow.parentRunId"));
  // Every point of metrics.jsonl, the core's and memory_log's.
  expect_same_metrics(r.run_dir, run);
  EXPECT_TRUE(run["metrics"].contains("train/accuracy"));
  EXPECT_TRUE(run["metrics"].contains("memory/peak_mb"));
}

TEST_F(Mlflow, SpecialValuesAndARefusedKeyArriveAsMlflowStoresThem) {
  const std::string uri = shared_uri();
  const auto r = train(uri, {}, "run", {std::make_shared<OddValues>()});
  ASSERT_EQ(r.status, trainer::RunStatus::Finished) << r.message;
  const json run = mlflow_read("run " + uri + " " + run_id_of(r.run_dir, uri));
  const json& m = run["metrics"];
  ASSERT_TRUE(m.contains("odd/nan"));
  ASSERT_EQ(m["odd/nan"].size(), 4u);  // 4 steps
  for (const auto& p : m["odd/nan"]) EXPECT_EQ(p[1], "NaN");
  // MLflow's SQL store keeps ±infinity as ±DBL_MAX (sqlalchemy_store.py, sanitize_metric_value).
  for (const auto& p : m["odd/inf"]) EXPECT_EQ(p[1], std::numeric_limits<double>::max());
  for (const auto& p : m["odd/-inf"]) EXPECT_EQ(p[1], -std::numeric_limits<double>::max());
  // "odd|bad key" is not a valid MLflow key: logged as "odd_bad key", nothing dropped.
  EXPECT_FALSE(m.contains("odd|bad key"));
  ASSERT_TRUE(m.contains("odd_bad key"));
  EXPECT_EQ(m["odd_bad key"].size(), 4u);
  EXPECT_EQ(m["odd_bad key"][0][1], 1.5);
}

TEST_F(Mlflow, OverLongValuesAreReportedAndCutToMlflowsLimits) {
  const std::string uri = shared_uri();
  auto o = mlflow_overrides(uri);
  o.push_back("+plugins.mlflow.tags=[\"note=" + std::string(8100, 'x') + "\"]");
  auto options = options_for(kRun, o, "run");
  options.log_level = "warn";
  const auto r = trainer::Trainer(std::move(options)).fit();
  ASSERT_EQ(r.status, trainer::RunStatus::Finished) << r.message;
  const json run = mlflow_read("run " + uri + " " + run_id_of(r.run_dir, uri));
  // The tag list is a param too: over 6000 characters as TOML.
  EXPECT_EQ(run["params"]["plugins.mlflow.tags"].get<std::string>().size(), mlf::kMaxParamValueLength);
  EXPECT_EQ(run["tags"]["note"].get<std::string>(), std::string(mlf::kMaxTagValueLength, 'x'));
  const std::string log = read_file(r.run_dir + "/trainer.log");
  EXPECT_NE(log.find("mlflow: param 'plugins.mlflow.tags' is 8109 characters, MLflow keeps 6000"), std::string::npos)
      << log;
  EXPECT_NE(log.find("mlflow: tag 'note' is 8100 characters, MLflow keeps 8000"), std::string::npos) << log;
}

TEST_F(Mlflow, ArtifactsAreTheResolvedConfigAndTheLastCheckpoint) {
  const std::string uri = shared_uri();
  const auto r = train(uri, {"+plugins.mlflow.log_checkpoint=true"}, "run");
  ASSERT_EQ(r.status, trainer::RunStatus::Finished) << r.message;
  const json run = mlflow_read("run " + uri + " " + run_id_of(r.run_dir, uri));
  std::map<std::string, long> artifacts;
  for (const auto& a : run["artifacts"]) artifacts[a["path"].get<std::string>()] = a["size"].get<long>();
  ASSERT_TRUE(artifacts.count("config.toml")) << run["artifacts"].dump();
  EXPECT_EQ(artifacts["config.toml"], static_cast<long>(fs::file_size(r.run_dir + "/config.toml")));
  const std::string ckpt = "checkpoints/" + fs::path(r.last_checkpoint).filename().string();
  ASSERT_TRUE(artifacts.count(ckpt)) << run["artifacts"].dump();
  EXPECT_EQ(artifacts[ckpt], static_cast<long>(fs::file_size(r.last_checkpoint)));
}

/// Throws at the given step.
class FailAt final : public trainer::Plugin {
 public:
  explicit FailAt(std::int64_t step) : step_(step) {}
  std::string name() const override { return "fail_at"; }
  std::vector<trainer::Event> events() const override { return {trainer::Event::BatchEnd}; }
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }
  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (ctx.state.global_step == step_) throw std::runtime_error("the loss went through the floor");
  }

 private:
  std::int64_t step_;
};

TEST_F(Mlflow, AFailedRunIsFailedWithItsError) {
  const std::string uri = shared_uri();
  const auto r = train(uri, {}, "run", {std::make_shared<FailAt>(3)});
  ASSERT_EQ(r.status, trainer::RunStatus::Failed);
  const json run = mlflow_read("run " + uri + " " + run_id_of(r.run_dir, uri));
  EXPECT_EQ(run["info"]["status"], "FAILED");
  EXPECT_GT(run["info"]["end_time"].get<long>(), 0);
  EXPECT_NE(run["tags"]["trainer.error"].get<std::string>().find("the loss went through the floor"), std::string::npos)
      << run["tags"].dump();
  expect_same_metrics(r.run_dir, run);
}

/// Polls until the run's journal has been acknowledged up to a metric batch.
bool wait_for_sent_metrics(const std::string& run_dir, const std::string& uri) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto p = mlf::read_progress(mlf::journal_dir(run_dir), uri);
    if (!p.run_id.empty() && p.seq >= 4) return true;  // start, params, config, metrics
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST_F(Mlflow, ASigintRunIsKilled) {
  const std::string uri = shared_uri();
  const std::string dir = tmp_ / "run";
  Child child(cli_command(uri, "run", kEndless));
  ASSERT_TRUE(wait_for_sent_metrics(dir, uri)) << read_file(dir + ".log");
  ASSERT_TRUE(child.signal(SIGINT));
  const int status = child.wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130) << read_file(dir + ".log");
  const json run = mlflow_read("run " + uri + " " + run_id_of(dir, uri));
  EXPECT_EQ(run["info"]["status"], "KILLED");
  EXPECT_GT(run["info"]["end_time"].get<long>(), 0);
  expect_same_metrics(dir, run);
}

TEST_F(Mlflow, AKill9RunIsMarkedFailedBySync) {
  const std::string uri = shared_uri();
  const std::string dir = tmp_ / "run";
  Child child(cli_command(uri, "run", kEndless));
  ASSERT_TRUE(wait_for_sent_metrics(dir, uri)) << read_file(dir + ".log");
  ASSERT_TRUE(child.signal(SIGKILL));
  child.wait();
  const std::string id = run_id_of(dir, uri);
  EXPECT_EQ(mlflow_read("run " + uri + " " + id)["info"]["status"], "RUNNING");
  const Shell sync = sh(std::string(TRAINER_CLI) + " mlflow sync " + dir);
  ASSERT_EQ(sync.code, 0) << sync.text;
  EXPECT_NE(sync.text.find("marking it FAILED"), std::string::npos) << sync.text;
  const json run = mlflow_read("run " + uri + " " + id);
  EXPECT_EQ(run["info"]["status"], "FAILED");
  EXPECT_GT(run["info"]["end_time"].get<long>(), 0);
  EXPECT_NE(run["tags"].value("trainer.end_reason", "").find("ended without closing"), std::string::npos);
  // Everything the killed process logged is there (the last metrics.jsonl group may not have
  // reached the journal: the process died between the two).
  const auto server = server_metrics(run);
  const auto local = local_metrics(dir);
  for (const auto& [key, points] : server) {
    ASSERT_TRUE(local.count(key)) << key;
    for (const auto& p : points) EXPECT_TRUE(local.at(key).count(p)) << key;
  }
  // A second sync has nothing left to send.
  const Shell again = sh(std::string(TRAINER_CLI) + " mlflow sync " + dir);
  EXPECT_EQ(again.code, 0) << again.text;
  EXPECT_NE(again.text.find("sent 0 of 0 records"), std::string::npos) << again.text;
}

TEST_F(Mlflow, AKill9RunResumedContinuesItsMlflowRun) {
  const std::string uri = shared_uri();
  const std::string dir = tmp_ / "run";
  const std::string args = " dataset.size=512 eval.every_epochs=0 eval.at_end=false checkpoint.every_steps=4";
  Child child(cli_command(uri, "run", args + " training.epochs=50"));
  ASSERT_TRUE(wait_for_sent_metrics(dir, uri)) << read_file(dir + ".log");
  ASSERT_TRUE(trainer::testing::wait_for_text(dir + "/checkpoints/latest", "step_")) << read_file(dir + ".log");
  ASSERT_TRUE(child.signal(SIGKILL));
  child.wait();
  const std::string id = run_id_of(dir, uri);
  ASSERT_FALSE(id.empty());
  // As if the server had acknowledged only the start: the resumed run sends the rest first.
  const std::string journal_dir = mlf::journal_dir(dir).string();
  const auto lines = read_lines(journal_dir + "/journal.jsonl");
  ASSERT_GT(lines.size(), 3u);
  json sent = json::parse(read_file(journal_dir + "/sent.json"));
  for (auto& [key, d] : sent["destinations"].items()) {
    d["seq"] = 1;
    d["offset"] = lines[0].size() + 1;
  }
  write_file(journal_dir + "/sent.json", sent.dump());
  const Shell resumed = sh(cli_command(uri, "resumed", args + " training.epochs=1 --resume " + dir));
  ASSERT_EQ(resumed.code, 0) << read_file(tmp_ / "resumed.log");
  EXPECT_EQ(run_id_of(tmp_ / "resumed", uri), id);
  long last_seq = 0;  // of the last whole record (the kill may have cut the last line)
  for (const auto& l : lines) {
    const json rec = json::parse(l, nullptr, false);
    if (rec.is_object()) last_seq = rec["seq"].get<long>();
  }
  EXPECT_EQ(mlf::read_progress(journal_dir, uri).seq, last_seq);
  const json found = mlflow_read("search " + uri + " '" + experiment() + "'");
  EXPECT_EQ(found["runs"].size(), 1u) << found.dump();
  const json run = mlflow_read("run " + uri + " " + id);
  EXPECT_EQ(run["info"]["status"], "FINISHED");
  // What the killed run's journal held is there, with the resumed run's metrics.
  const auto server = server_metrics(run);
  for (const std::string& d : {dir, std::string(tmp_ / "resumed")}) {
    const auto journal = read_lines((mlf::journal_dir(d) / "journal.jsonl").string());
    for (const auto& line : journal) {
      const json rec = json::parse(line, nullptr, false);
      if (!rec.is_object()) continue;                              // a line the kill cut
      for (const auto& m : rec.value("metrics", json::array())) {  // [key, value, timestamp, step]
        const std::string key = m[0].get<std::string>();
        ASSERT_TRUE(server.count(key)) << m.dump();
        EXPECT_TRUE(server.at(key).count({m[3].get<long>(), value_text(m[1]), m[2].get<long>()}))
            << d << ": " << m.dump();
      }
    }
  }
}

/// Stops the MLflow server in `dir` at the start of the second epoch, once the first epoch's
/// metrics were acknowledged.
class StopServer final : public trainer::Plugin {
 public:
  StopServer(std::string server_dir, std::string uri) : server_dir_(std::move(server_dir)), uri_(std::move(uri)) {}
  std::string name() const override { return "stop_server"; }
  std::vector<trainer::Event> events() const override { return {trainer::Event::EpochStart}; }
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }
  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (ctx.state.epoch != 1) return;
    if (!wait_for_sent_metrics(ctx.run_dir, uri_)) throw std::runtime_error("nothing was sent in the first epoch");
    const Shell r = sh(kScript + " stop " + server_dir_);
    if (r.code != 0) throw std::runtime_error("cannot stop the server: " + r.text);
    stopped_at_seq = mlf::read_progress(mlf::journal_dir(ctx.run_dir), uri_).seq;
  }
  std::int64_t stopped_at_seq = -1;

 private:
  std::string server_dir_, uri_;
};

TEST_F(Mlflow, ServerStoppedMidRunThenSyncSendsEveryMetricOnce) {
  // A server of its own, stopped and started again on the same port and database.
  const std::string server = tmp_ / "server";
  const Shell start = sh(kScript + " start " + kVenv + " " + server);
  ASSERT_EQ(start.code, 0) << start.text;
  const std::string port = read_file(server + "/port").substr(0, read_file(server + "/port").find('\n'));
  const std::string uri = "http://127.0.0.1:" + port;
  auto stopper = std::make_shared<StopServer>(server, uri);
  const auto r = train(uri,
                       {"training.epochs=3", "+plugins.mlflow.flush_interval_s=0.05",
                        "+plugins.mlflow.shutdown_timeout_s=1", "+plugins.mlflow.request_timeout_s=2"},
                       "run", {stopper});
  ASSERT_EQ(r.status, trainer::RunStatus::Finished) << r.message;  // the outage did not fail the run
  ASSERT_GT(stopper->stopped_at_seq, 0);
  const std::string id = run_id_of(r.run_dir, uri);
  ASSERT_FALSE(id.empty());
  const std::string journal = mlf::journal_dir(r.run_dir).string();
  EXPECT_GT(mlf::read_progress(journal, uri).seq, 0);
  // The records of epochs 2 and 3 wait in the journal.
  const Shell down = sh(std::string(TRAINER_CLI) + " mlflow sync " + r.run_dir);
  EXPECT_EQ(down.code, 3) << down.text;
  EXPECT_NE(down.text.find("left in the journal"), std::string::npos) << down.text;
  const Shell restart = sh(kScript + " start " + kVenv + " " + server + " " + port);
  ASSERT_EQ(restart.code, 0) << restart.text;
  const Shell sync = sh(std::string(TRAINER_CLI) + " mlflow sync " + r.run_dir);
  EXPECT_EQ(sync.code, 0) << sync.text;
  const json run = mlflow_read("run " + uri + " " + id);
  sh(kScript + " stop " + server);
  EXPECT_EQ(run["info"]["status"], "FINISHED");
  expect_same_metrics(r.run_dir, run);
  EXPECT_EQ(run["metrics"]["train/loss"].size(), 6u);  // 3 epochs of 2 steps
}

TEST_F(Mlflow, NestedRunsHaveTheirParentAndTheirOwnStatus) {
  const std::string uri = shared_uri();
  auto backend = mlf::open_backend(uri);
  const mlf::RunInfo parent = mlf::start_run(*backend, experiment(), "sweep");
  const auto a = train(uri, {"+plugins.mlflow.parent_run_id=\"" + parent.run_id + "\""}, "trial_a");
  const auto b =
      train(uri, {"+plugins.mlflow.parent_run_id=\"" + parent.run_id + "\""}, "trial_b", {std::make_shared<FailAt>(2)});
  ASSERT_EQ(a.status, trainer::RunStatus::Finished);
  ASSERT_EQ(b.status, trainer::RunStatus::Failed);
  mlf::end_run(*backend, parent.run_id, "FINISHED");
  const json found = mlflow_read("search " + uri + " '" + experiment() + "'");
  std::map<std::string, json> by_name;
  for (const auto& run : found["runs"]) by_name[run["info"]["run_name"].get<std::string>()] = run;
  ASSERT_EQ(by_name.size(), 3u) << found.dump();
  EXPECT_EQ(by_name["sweep"]["info"]["status"], "FINISHED");
  EXPECT_FALSE(by_name["sweep"]["tags"].contains("mlflow.parentRunId"));
  EXPECT_EQ(by_name["trial_a"]["tags"]["mlflow.parentRunId"], parent.run_id);
  EXPECT_EQ(by_name["trial_b"]["tags"]["mlflow.parentRunId"], parent.run_id);
  EXPECT_EQ(by_name["trial_a"]["info"]["status"], "FINISHED");
  EXPECT_EQ(by_name["trial_b"]["info"]["status"], "FAILED");
}

TEST_F(Mlflow, AResumedRunContinuesItsMlflowRun) {
  const std::string uri = shared_uri();
  const auto first = train(uri, {"training.epochs=1"}, "first");
  ASSERT_EQ(first.status, trainer::RunStatus::Finished) << first.message;
  auto o = mlflow_overrides(uri);
  o.push_back("training.epochs=2");
  auto options = options_for(kRun, o, "second");
  options.resume = first.run_dir;
  const auto second = trainer::Trainer(std::move(options)).fit();
  ASSERT_EQ(second.status, trainer::RunStatus::Finished) << second.message;
  const std::string id = run_id_of(first.run_dir, uri);
  EXPECT_EQ(run_id_of(second.run_dir, uri), id);
  const json found = mlflow_read("search " + uri + " '" + experiment() + "'");
  EXPECT_EQ(found["runs"].size(), 1u) << found.dump();
  const json run = mlflow_read("run " + uri + " " + id);
  EXPECT_EQ(run["info"]["status"], "FINISHED");
  EXPECT_EQ(loss_steps(run), (std::set<long>{1, 2, 3, 4}));
  bool resumed_config = false;
  for (const auto& a : run["artifacts"]) resumed_config |= a["path"].get<std::string>().rfind("config_resumed", 0) == 0;
  EXPECT_TRUE(resumed_config) << run["artifacts"].dump();
}

// `trainer --resume RUN_DIR` goes on in RUN_DIR: its journal goes on too, into the same MLflow run.
TEST_F(Mlflow, AResumeInPlaceContinuesItsMlflowRun) {
  const std::string uri = "file:" + (tmp_ / "mlruns");
  const auto first = train(uri, {"training.epochs=1"}, "run");
  ASSERT_EQ(first.status, trainer::RunStatus::Finished) << first.message;
  auto o = mlflow_overrides(uri);
  o.push_back("training.epochs=2");
  auto options = options_for(kRun, o, "unused");
  options.run_dir.clear();
  options.resume = first.run_dir;
  const auto second = trainer::Trainer(std::move(options)).fit();
  ASSERT_EQ(second.status, trainer::RunStatus::Finished) << second.message;
  EXPECT_EQ(second.run_dir, first.run_dir);
  const std::string id = run_id_of(first.run_dir, uri);
  ASSERT_FALSE(id.empty());
  const json found = mlflow_read("search " + uri + " '" + experiment() + "'");
  EXPECT_EQ(found["runs"].size(), 1u) << found.dump();
  const json run = mlflow_read("run " + uri + " " + id);
  EXPECT_EQ(run["info"]["status"], "FINISHED");
  EXPECT_EQ(loss_steps(run), (std::set<long>{1, 2, 3, 4}));
  ASSERT_EQ(run["metrics"]["resume/step"].size(), 1u) << run["metrics"].dump();
}

TEST_F(Mlflow, AResumedRunContinuesTheMlflowRunOfTheDirectoryItsCheckpointWasLoadedFrom) {
  // A run directory moved after it ended (or copied from another machine): its journal and
  // sent.json are where the checkpoint was loaded from, not where its state says it was written.
  const std::string uri = "file:" + (tmp_ / "mlruns");
  const auto first = train(uri, {"training.epochs=1"}, "first");
  ASSERT_EQ(first.status, trainer::RunStatus::Finished) << first.message;
  const std::string moved = tmp_ / "moved";
  fs::rename(first.run_dir, moved);
  auto o = mlflow_overrides(uri);
  o.push_back("training.epochs=2");
  auto options = options_for(kRun, o, "second");
  options.resume = moved;
  options.log_level = "info";
  const auto second = trainer::Trainer(std::move(options)).fit();
  ASSERT_EQ(second.status, trainer::RunStatus::Finished) << second.message;
  const std::string id = run_id_of(moved, uri);
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(run_id_of(second.run_dir, uri), id);
  const auto journal = read_lines((mlf::journal_dir(second.run_dir) / "journal.jsonl").string());
  ASSERT_FALSE(journal.empty());
  const json cont = json::parse(journal.front());
  EXPECT_EQ(cont["op"], "continue");
  EXPECT_EQ(cont["previous_run_dir"], moved);
  const std::string log = read_file(second.run_dir + "/trainer.log");
  EXPECT_NE(log.find("the checkpoint was written in " + first.run_dir), std::string::npos) << log;
}

TEST_F(Mlflow, TheFileStoreIsReadByMlflowAndSyncsToAServer) {
  const std::string store = tmp_ / "mlruns";
  const std::string uri = "file:" + store;
  const auto r = train(uri, {}, "run", {std::make_shared<OddValues>()});
  ASSERT_EQ(r.status, trainer::RunStatus::Finished) << r.message;
  const std::string id = run_id_of(r.run_dir, uri);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(fs::exists(store + "/0/meta.yaml"));  // MLflow's Default experiment, as its FileStore makes it
  const json run = mlflow_read("run " + uri + " " + id);
  EXPECT_EQ(run["info"]["status"], "FINISHED");
  EXPECT_EQ(run["info"]["run_name"], "run");
  EXPECT_EQ(run["params"]["training.batch_size"], "32");
  EXPECT_EQ(run["tags"]["mlflow.runName"], "run");
  bool config = false;
  for (const auto& a : run["artifacts"]) config |= a["path"] == "config.toml";
  EXPECT_TRUE(config) << run["artifacts"].dump();
  for (const auto& p : run["metrics"]["odd/nan"]) EXPECT_EQ(p[1], "NaN");
  {
    // Everything of metrics.jsonl, with the invalid key under its valid name.
    auto local = local_metrics(r.run_dir);
    local["odd_bad key"] = local["odd|bad key"];
    local.erase("odd|bad key");
    const auto server = server_metrics(run);
    EXPECT_EQ(server, local);
  }
  // The same journal, sent to a server: a new run there with the same contents.
  const std::string server_uri = shared_uri();
  const Shell sync = sh(std::string(TRAINER_CLI) + " mlflow sync " + r.run_dir + " --tracking-uri " + server_uri);
  ASSERT_EQ(sync.code, 0) << sync.text;
  const std::string server_id = run_id_of(r.run_dir, server_uri);
  ASSERT_FALSE(server_id.empty()) << sync.text;
  const json moved = mlflow_read("run " + server_uri + " " + server_id);
  EXPECT_EQ(moved["info"]["status"], "FINISHED");
  EXPECT_EQ(moved["params"], run["params"]);
  // The same points; ±infinity as the SQL store keeps it (±DBL_MAX).
  auto in_file = server_metrics(run);
  for (const char* key : {"odd/inf", "odd/-inf"}) {
    std::set<Point> as_sql;
    for (const auto& [step, value, ts] : in_file[key]) {
      as_sql.insert(
          {step,
           value_text(value == "Infinity" ? std::numeric_limits<double>::max() : -std::numeric_limits<double>::max()),
           ts});
    }
    in_file[key] = as_sql;
  }
  EXPECT_EQ(server_metrics(moved), in_file);
}

TEST_F(Mlflow, SyncRefusesWhatItCannotDo) {
  const Shell none = sh(std::string(TRAINER_CLI) + " mlflow sync " + tmp_.str());
  EXPECT_EQ(none.code, 2) << none.text;
  EXPECT_NE(none.text.find("has no MLflow journal"), std::string::npos) << none.text;
  const Shell missing = sh(std::string(TRAINER_CLI) + " mlflow sync " + (tmp_ / "nope"));
  EXPECT_EQ(missing.code, 2) << missing.text;
  const Shell usage = sh(std::string(TRAINER_CLI) + " mlflow push " + tmp_.str());
  EXPECT_EQ(usage.code, 2) << usage.text;
  // A journal still being written (its lock held) is left to its writer.
  write_file(tmp_ / "held/mlflow/journal.jsonl", "");
  mlf::JournalLock lock(mlf::journal_dir(tmp_ / "held"));
  const Shell held = sh(std::string(TRAINER_CLI) + " mlflow sync " + (tmp_ / "held"));
  EXPECT_EQ(held.code, 2) << held.text;
  EXPECT_NE(held.text.find("pid " + std::to_string(::getpid())), std::string::npos) << held.text;
}

TEST_F(Mlflow, AnUnusableTrackingUriIsAConfigError) {
  const auto r = train("ftp://example.org", {}, "run");
  EXPECT_EQ(r.exit_code, trainer::kExitUsage);
  EXPECT_NE(r.message.find("ftp://example.org"), std::string::npos) << r.message;
}

}  // namespace
