// Credentials in a run's config reach only the server they are for. A tracking URI with
// "user:password@" authenticates the run to its server (basic authentication, as given), and
// neither the password nor the value of a key named like a secret is in any file of the run directory
// (config.toml, checkpoints, status.json, trainer.log, the MLflow journal and the plugin's state,
// TensorBoard's event files), nor in what the server gets besides the Authorization header.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "scripted_server.h"
#include "support/test_util.h"

namespace {

using trainer::testing::read_file;
using trainer::testing::run_command;
using trainer::testing::ScriptedServer;
using trainer::testing::TrainerTest;
namespace fs = std::filesystem;

constexpr auto npos = std::string::npos;

/// What an MLflow tracking server answers a run with: its experiment, the run it creates (and
/// gets), no run found by a tag, and 200 to the rest (batches, updates, artifacts).
ScriptedServer::Answer mlflow_answer(const std::string& request) {
  const std::string run = R"({"run": {"info": {"run_id": "r1", "experiment_id": "1", "status": "RUNNING",
                                               "artifact_uri": "mlflow-artifacts:/1/r1/artifacts"}}})";
  if (request.find(" /api/2.0/mlflow/experiments/get-by-name?") != npos) {
    return {200, R"({"experiment": {"experiment_id": "1", "lifecycle_stage": "active"}})"};
  }
  if (request.find(" /api/2.0/mlflow/runs/create ") != npos || request.find(" /api/2.0/mlflow/runs/get?") != npos) {
    return {200, run};
  }
  if (request.find(" /api/2.0/mlflow/runs/search ") != npos) return {200, R"({"runs": []})"};
  return {200, "{}"};
}

/// The files under `dir` whose bytes hold `text`.
std::vector<std::string> files_holding(const fs::path& dir, const std::string& text) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    if (bytes.str().find(text) != npos) out.push_back(e.path().string());
  }
  return out;
}

const std::string kRun = std::string(trainer::testing::kSmallRun) + R"(
[plugins]
load = ["mlflow", "tensorboard"]
)";

class MlflowCredentials : public TrainerTest {};

TEST_F(MlflowCredentials, AUrisPasswordAndASecretKeyReachTheServerAndNoFileOfTheRun) {
  ScriptedServer server(mlflow_answer);
  const std::string port = std::to_string(server.port());
  // ema is not loaded: its section is kept as written, and a key of it is named like a secret.
  const trainer::RunResult r =
      fit(kRun,
          {"+plugins.mlflow.tracking_uri=\"http://ana:pw-hunter2@127.0.0.1:" + port + "\"",
           "+plugins.mlflow.tags=[\"link=http://ana:pw-hunter2@127.0.0.1/x\"]", "+plugins.ema.hf_token=\"hf-hunter2\""},
          "run");
  ASSERT_EQ(r.exit_code, 0) << r.message;
  // The server got the run, every request with the credentials of the URI.
  ASSERT_FALSE(server.requests.empty());
  bool params = false, ended = false;
  for (const auto& req : server.requests) {
    EXPECT_NE(req.find("Authorization: Basic YW5hOnB3LWh1bnRlcjI="), npos) << req;  // ana:pw-hunter2
    EXPECT_EQ(req.find("hunter2"), npos) << req;
    params = params || (req.find("runs/log-batch") != npos && req.find("\"training.batch_size\"") != npos);
    ended = ended || (req.find("runs/update") != npos && req.find("FINISHED") != npos);
  }
  EXPECT_TRUE(params);
  EXPECT_TRUE(ended);
  // Nothing the run wrote holds them: not as text, not inside a checkpoint or an event file.
  const fs::path dir = tmp_ / "run";
  ASSERT_TRUE(fs::exists(dir / "mlflow" / "journal.jsonl"));
  ASSERT_TRUE(fs::is_directory(dir / "tensorboard"));
  ASSERT_FALSE(files_holding(dir / "checkpoints", "PK").empty());  // a checkpoint (a zip archive)
  EXPECT_EQ(files_holding(dir, "hunter2"), std::vector<std::string>{});
  EXPECT_EQ(files_holding(dir, "ana:"), std::vector<std::string>{});
  // What they are written as: the URI without its userinfo, the secret's key left out.
  const std::string config = read_file(dir / "config.toml");
  EXPECT_NE(config.find("tracking_uri = \"http://127.0.0.1:" + port + "\""), npos) << config;
  EXPECT_EQ(config.find("hf_token ="), npos) << config;
  // Its name only, in a comment, for a resume to say what it runs without.
  EXPECT_NE(config.find("# plugins.ema.hf_token: left out (a secret)"), npos) << config;
  EXPECT_NE(read_file(dir / "mlflow" / "journal.jsonl").find("\"tracking_uri\":\"http://127.0.0.1:" + port + "\""),
            npos);
}

/// `trainer mlflow sync RUN_DIR` with MLFLOW_TRACKING_URI set to `uri` (and no other MLflow
/// credentials from the caller's environment): its exit code and what it printed.
trainer::testing::CommandOutput sync_with_env_uri(const std::string& uri, const fs::path& run_dir) {
  return run_command(
      "env -u MLFLOW_TRACKING_TOKEN -u MLFLOW_TRACKING_USERNAME -u MLFLOW_TRACKING_PASSWORD "
      "MLFLOW_TRACKING_URI='" +
      uri + "' " + TRAINER_CLI + " mlflow sync " + run_dir.string());
}

// The journal keeps the run's tracking URI without its credentials; the user gives them again
// as docs/metrics.md says, in MLFLOW_TRACKING_URI. Sync takes that for the journal's server,
// sends there with those credentials, and prints them nowhere, nor when it refuses a URI.
TEST_F(MlflowCredentials, SyncWithTheCredentialsInMlflowTrackingUriSendsTheJournalAndPrintsThemNowhere) {
  std::atomic<bool> away{true};  // the server answers 503 during the run: its records stay in the journal
  ScriptedServer server([&away](const std::string& request) -> ScriptedServer::Answer {
    if (away) return {503, R"({"error_code": "TEMPORARILY_UNAVAILABLE"})"};
    return mlflow_answer(request);
  });
  const std::string port = std::to_string(server.port());
  const std::string with_credentials = "http://ana:pw-hunter2@127.0.0.1:" + port;
  const trainer::RunResult r =
      fit(kRun, {"+plugins.mlflow.tracking_uri=\"" + with_credentials + "\"", "+plugins.mlflow.shutdown_timeout_s=0"},
          "run");
  ASSERT_EQ(r.exit_code, 0) << r.message;
  const fs::path dir = tmp_ / "run";
  ASSERT_NE(read_file(dir / "mlflow" / "journal.jsonl").find("\"tracking_uri\":\"http://127.0.0.1:" + port + "\""),
            npos);
  away = false;
  const std::size_t before = server.requests.size();
  // Another server's URI: which did the user mean? Refused, naming both without credentials.
  const auto other = sync_with_env_uri("http://ana:pw-hunter2@127.0.0.1:9", dir);
  EXPECT_EQ(other.code, 2) << other.text;
  EXPECT_NE(other.text.find("MLFLOW_TRACKING_URI is http://127.0.0.1:9:"), npos) << other.text;
  EXPECT_EQ(other.text.find("hunter2"), npos) << other.text;
  EXPECT_EQ(server.requests.size(), before);
  // The journal's server, with credentials: sent there with them.
  const auto sync = sync_with_env_uri(with_credentials, dir);
  EXPECT_EQ(sync.code, 0) << sync.text;
  EXPECT_NE(sync.text.find("to http://127.0.0.1:" + port), npos) << sync.text;
  EXPECT_EQ(sync.text.find("hunter2"), npos) << sync.text;
  ASSERT_GT(server.requests.size(), before);
  bool created = false, ended = false;
  for (std::size_t i = before; i < server.requests.size(); ++i) {
    const std::string& req = server.requests[i];
    EXPECT_NE(req.find("Authorization: Basic YW5hOnB3LWh1bnRlcjI="), npos) << req;  // ana:pw-hunter2
    EXPECT_EQ(req.find("hunter2"), npos) << req;
    created = created || req.find("runs/create") != npos;
    ended = ended || (req.find("runs/update") != npos && req.find("FINISHED") != npos);
  }
  EXPECT_TRUE(created);
  EXPECT_TRUE(ended);
  EXPECT_EQ(files_holding(dir, "hunter2"), std::vector<std::string>{});
}

/// `trainer --resume RUN_DIR ARGS` with `env` (NAME=VALUE ...) and no other MLflow setting from
/// the caller's environment: its exit code and what it printed.
trainer::testing::CommandOutput resume_with_env(const std::string& env, const fs::path& run_dir,
                                                const std::string& args = "") {
  return run_command(
      "env -u MLFLOW_TRACKING_URI -u MLFLOW_TRACKING_TOKEN -u MLFLOW_TRACKING_USERNAME -u MLFLOW_TRACKING_PASSWORD " +
      env + " " + TRAINER_CLI + " --resume " + run_dir.string() + " training.epochs=3 " + args);
}

// A run directory is data: a server that only its config.toml names gets no credentials from
// the environment on `--resume RUN_DIR` (here someone pointed it at their own listener). The
// run is refused before any request, saying how to name the server; named again (on the command
// line or as MLFLOW_TRACKING_URI), the server is the user's and gets them.
TEST_F(MlflowCredentials, AResumeSendsNoCredentialsToAServerOnlyTheRunDirectoryNames) {
  ScriptedServer server(mlflow_answer), planted(mlflow_answer);
  const std::string uri = "http://127.0.0.1:" + std::to_string(server.port());
  const std::string planted_uri = "http://127.0.0.1:" + std::to_string(planted.port());
  const trainer::RunResult r = fit(kRun, {"+plugins.mlflow.tracking_uri=\"" + uri + "\""}, "run");
  ASSERT_EQ(r.exit_code, 0) << r.message;
  const fs::path dir = tmp_ / "run";
  const std::string config = read_file(dir / "config.toml");
  const std::string stored_line = "tracking_uri = \"" + uri + "\"";
  ASSERT_NE(config.find(stored_line), npos) << config;
  std::string edited = config;
  edited.replace(edited.find(stored_line), stored_line.size(), "tracking_uri = \"" + planted_uri + "\"");
  trainer::testing::write_file(dir / "config.toml", edited);
  const std::string token = "MLFLOW_TRACKING_TOKEN=tok-hunter2";

  const auto refused = resume_with_env(token, dir);
  EXPECT_EQ(refused.code, 2) << refused.text;
  EXPECT_NE(refused.text.find((dir / "config.toml").string() + ":"), npos) << refused.text;
  EXPECT_NE(refused.text.find("plugins.mlflow.tracking_uri = '" + planted_uri +
                              "' is named by the run directory alone, and MLflow credentials are set"),
            npos)
      << refused.text;
  EXPECT_NE(refused.text.find("MLFLOW_TRACKING_URI=" + planted_uri), npos) << refused.text;
  EXPECT_TRUE(planted.requests.empty()) << planted.requests.front();
  // Without credentials nothing is at stake: the stored server is used as before.
  const auto without = resume_with_env("", dir);
  EXPECT_EQ(without.code, 0) << without.text;
  ASSERT_FALSE(planted.requests.empty());
  for (const auto& req : planted.requests) EXPECT_EQ(req.find("Authorization"), npos) << req;

  // Named by the user, as an override or as MLFLOW_TRACKING_URI: the server gets the token.
  trainer::testing::write_file(dir / "config.toml", config);
  const auto named = resume_with_env(token, dir, "training.epochs=4 'plugins.mlflow.tracking_uri=\"" + uri + "\"'");
  EXPECT_EQ(named.code, 0) << named.text;
  const auto by_env = resume_with_env(token + " MLFLOW_TRACKING_URI=" + uri, dir, "training.epochs=5");
  EXPECT_EQ(by_env.code, 0) << by_env.text;
  ASSERT_FALSE(server.requests.empty());
  EXPECT_NE(server.requests.back().find("Authorization: Bearer tok-hunter2"), npos) << server.requests.back();
}

}  // namespace
