// Credentials in a run's config reach only the server they are for. A tracking URI with
// "user:password@" authenticates the run to its server (basic authentication, as given), and
// neither the password nor a key named like a secret is in any file of the run directory
// (config.toml, checkpoints, status.json, trainer.log, the MLflow journal and the plugin's state,
// TensorBoard's event files), nor in what the server gets besides the Authorization header.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "scripted_server.h"
#include "support/test_util.h"

namespace {

using trainer::testing::read_file;
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
  EXPECT_EQ(config.find("hf_token"), npos) << config;
  EXPECT_NE(read_file(dir / "mlflow" / "journal.jsonl").find("\"tracking_uri\":\"http://127.0.0.1:" + port + "\""),
            npos);
}

}  // namespace
