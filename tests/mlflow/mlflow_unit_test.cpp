// The MLflow client without a server: MLflow's key rules, the journal's batching, what
// happens when nothing answers, and what `trainer mlflow sync` refuses in a journal from
// someone else (and the file store outside its root).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "mlflow_client.h"
#include "mlflow_export.h"
#include "scripted_server.h"
#include "support/bounded_child.h"
#include "support/test_util.h"
#include "trainer/json.h"

namespace {

using nlohmann::json;
using trainer::testing::BoundedChild;
using trainer::testing::read_file;
using trainer::testing::read_lines;
using trainer::testing::run_bounded;
using trainer::testing::TempDir;
using trainer::testing::write_file;
namespace mlf = trainer::mlflow;
namespace fs = std::filesystem;

TEST(MlflowKeys, ValidKeysFollowMlflowsRules) {
  for (const char* k : {"train/loss", "a.b-c_d e:f", "eval/accuracy", "x"}) EXPECT_TRUE(mlf::valid_key(k)) << k;
  for (const char* k : {"", "a|b", "/lead", "trail/", "a//b", "a/./b", "a/../b", "..", "é", "a\tb"}) {
    EXPECT_FALSE(mlf::valid_key(k)) << k;
  }
  EXPECT_FALSE(mlf::valid_key(std::string(251, 'a')));
  EXPECT_TRUE(mlf::valid_key(std::string(250, 'a')));
}

TEST(MlflowKeys, SanitizedKeysAreValidAndKeepTheirMeaning) {
  EXPECT_EQ(mlf::sanitize_key("train/loss"), "train/loss");
  EXPECT_EQ(mlf::sanitize_key("a|b"), "a_b");
  EXPECT_EQ(mlf::sanitize_key("/a//b/"), "a/b");
  EXPECT_EQ(mlf::sanitize_key("a/../b"), "a/__/b");
  const std::string longer(300, 'k');
  const std::string cut = mlf::sanitize_key(longer);
  EXPECT_EQ(cut.size(), mlf::kMaxKeyLength);
  EXPECT_TRUE(mlf::valid_key(cut));
  EXPECT_NE(mlf::sanitize_key(longer + "x"), cut);  // the hash tells long keys apart
  for (const char* k : {"", "|", "//", "..", "é/ü"}) EXPECT_TRUE(mlf::valid_key(mlf::sanitize_key(k))) << k;
}

// The client writes a value that is not a finite number by the names trainer's JSON writer
// uses (trainer/json.h), which MLflow's JSON reads back.
TEST(MlflowKeys, SpecialValuesAreMlflowsJsonStrings) {
  EXPECT_EQ(trainer::json_number(std::nan("")), "\"NaN\"");
  EXPECT_EQ(trainer::json_number(std::numeric_limits<double>::infinity()), "\"Infinity\"");
  EXPECT_EQ(trainer::json_number(-std::numeric_limits<double>::infinity()), "\"-Infinity\"");
  EXPECT_EQ(trainer::json_number(0.5), "0.5");
}

TEST(MlflowUris, UnsupportedUrisAreRefusedNamingThem) {
  try {
    mlf::open_backend("databricks://workspace");
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("databricks://workspace"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("file:./mlruns"), std::string::npos);
  }
  EXPECT_THROW(mlf::open_backend("file://host/path"), std::invalid_argument);
}

std::vector<json> journal_records(const std::string& run_dir) {
  std::vector<json> out;
  for (const auto& l : read_lines((mlf::journal_dir(run_dir) / "journal.jsonl").string()))
    out.push_back(json::parse(l));
  return out;
}

std::vector<mlf::Metric> points(int n, int step = 1) {
  std::vector<mlf::Metric> out;
  for (int i = 0; i < n; ++i) out.push_back({"m/" + std::to_string(i % 7), double(i), 1000 + i, step});
  return out;
}

/// An exporter to a file store in `tmp`/mlruns, working on the caller's thread, with its
/// run started.
std::unique_ptr<mlf::Exporter> file_exporter(const TempDir& tmp) {
  const std::string store = "file:" + (tmp / "mlruns");
  mlf::ExportOptions o;
  o.background = false;
  auto e = std::make_unique<mlf::Exporter>(mlf::open_backend(store), tmp.str(), o, nullptr);
  e->record({{"op", "start"}, {"experiment", "e"}, {"run_name", "r"}, {"tracking_uri", store}});
  return e;
}

TEST(MlflowJournal, MetricsAreBatchedWithinMlflowsLimitsAndInOrder) {
  TempDir tmp;
  {
    auto e = file_exporter(tmp);
    e->metrics(points(2500));
    e->record({{"op", "end"}, {"status", "FINISHED"}, {"end_time", 5}});
    EXPECT_EQ(e->close(1.0), 0);
    EXPECT_EQ(e->metrics_sent(), 2500);
  }
  const auto recs = journal_records(tmp.str());
  ASSERT_EQ(recs.size(), 5u);
  EXPECT_EQ(recs[0]["op"], "start");
  EXPECT_EQ(recs[1]["metrics"].size(), 1000u);
  EXPECT_EQ(recs[2]["metrics"].size(), 1000u);
  EXPECT_EQ(recs[3]["metrics"].size(), 500u);
  EXPECT_EQ(recs[4]["op"], "end");
  for (std::size_t i = 0; i < recs.size(); ++i) EXPECT_EQ(recs[i]["seq"], static_cast<int>(i) + 1);
  EXPECT_EQ(recs[3]["metrics"][499][1], 2499.0);  // the last point logged is the last sent
}

TEST(MlflowJournal, NothingAnsweringKeepsEveryRecordAndCloseReturns) {
  TempDir tmp;
  // A port nothing listens on: connections are refused at once.
  const std::string uri = "http://127.0.0.1:9";
  mlf::ExportOptions o;
  o.flush_interval_s = 0.01;
  mlf::HttpOptions http;
  http.abort = [flag = o.abort] { return flag->load(); };
  std::int64_t left = 0;
  {
    mlf::Exporter e(mlf::open_backend(uri, {}, http), tmp.str(), o, nullptr);
    e.record({{"op", "start"}, {"experiment", "e"}, {"run_name", "r"}, {"tracking_uri", uri}});
    for (int step = 1; step <= 20; ++step) e.metrics(points(10, step));
    e.record({{"op", "end"}, {"status", "FINISHED"}, {"end_time", 5}});
    left = e.close(0.5);
  }
  const auto recs = journal_records(tmp.str());
  ASSERT_GE(recs.size(), 3u);
  EXPECT_EQ(left, static_cast<std::int64_t>(recs.size()));
  std::size_t metrics = 0;
  for (const auto& r : recs) metrics += r.value("metrics", json::array()).size();
  EXPECT_EQ(metrics, 200u);
  EXPECT_EQ(recs.back()["op"], "end");
  EXPECT_EQ(mlf::read_progress(mlf::journal_dir(tmp.str()), uri).seq, 0);
}

TEST(MlflowJournal, ARecordTheBackendRefusesIsKeptAsideAndPassed) {
  TempDir tmp;
  auto e = file_exporter(tmp);
  e->record({{"op", "batch"}, {"params", json::array({json::array({"p", "1"})})}});
  e->record({{"op", "batch"}, {"params", json::array({json::array({"p", "2"})})}});  // a changed param: refused
  e->metrics(points(3));
  EXPECT_EQ(e->close(1.0), 0);
  EXPECT_EQ(e->metrics_sent(), 3);
  const auto rejected = read_lines((mlf::journal_dir(tmp.str()) / "rejected.jsonl").string());
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_NE(rejected[0].find("\"2\""), std::string::npos);
}

TEST(MlflowJournal, ARecordCutShortByADeadWriterIsDroppedBeforeAppending) {
  TempDir tmp;
  {
    auto e = file_exporter(tmp);
    e->metrics(points(3));
    e->close(1.0);
  }
  const std::string store = "file:" + (tmp / "mlruns");
  const std::string journal = (mlf::journal_dir(tmp.str()) / "journal.jsonl").string();
  std::ofstream(journal, std::ios::app) << "{\"seq\":3,\"op\":\"batch\",\"metr";  // a kill -9 mid-write
  std::ostringstream out, err;
  EXPECT_EQ(mlf::sync_run_dir(tmp.str(), "", out, err), 0) << out.str() << err.str();
  EXPECT_NE(out.str().find("cut short"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("marking it FAILED"), std::string::npos) << out.str();
  const auto recs = journal_records(tmp.str());
  ASSERT_EQ(recs.size(), 4u);  // start, metrics, the sync's tag batch and end
  EXPECT_EQ(recs.back()["op"], "end");
  EXPECT_EQ(recs.back()["status"], "FAILED");
  EXPECT_EQ(mlf::read_progress(mlf::journal_dir(tmp.str()), store).seq, 4);
}

TEST(MlflowJournal, ASecondWriterIsRefusedNamingTheFirst) {
  TempDir tmp;
  mlf::JournalLock first(mlf::journal_dir(tmp.str()));
  try {
    mlf::JournalLock second(mlf::journal_dir(tmp.str()));
    FAIL() << "two writers";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(::getpid())), std::string::npos) << e.what();
  }
}

/// How many file descriptors this process has open.
std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// An exporter whose construction fails after it opened its journal (here: sent.json's entry
// for the store holds a seq that is not a number, which its sender cannot read) leaves no
// descriptor open, and its lock free.
TEST(MlflowJournal, AnExporterThatCannotStartClosesItsJournal) {
  TempDir tmp;
  const std::string store = "file:" + (tmp / "mlruns");
  const json sent{{"destinations", {{mlf::canonical_uri(store), {{"seq", "not a number"}}}}}};
  write_file((mlf::journal_dir(tmp.str()) / "sent.json").string(), sent.dump());
  mlf::ExportOptions o;
  o.background = false;
  auto backend = mlf::open_backend(store);
  const std::size_t before = open_fds();
  EXPECT_ANY_THROW(mlf::Exporter(std::move(backend), tmp.str(), o, nullptr));
  EXPECT_EQ(open_fds(), before);
  EXPECT_TRUE(fs::exists(mlf::journal_dir(tmp.str()) / "journal.jsonl"));  // it got as far as opening it
  mlf::JournalLock free_again(mlf::journal_dir(tmp.str()));
}

// The journal's folder is the run directory's (untrusted): a link planted at its lock or its
// journal is refused naming it, one at mlflow/ too; a link at sent.json's temporary or at
// rejected.jsonl never takes a write out of the run directory.
TEST(MlflowJournal, LinksPlantedInTheJournalsFolderAreNeverWrittenThrough) {
  TempDir tmp;
  const std::string outside = tmp / "outside.txt", store = "file:" + (tmp / "mlruns");
  mlf::ExportOptions o;
  o.background = false;
  const auto refusal = [&](const std::string& run) {
    try {
      mlf::Exporter e(mlf::open_backend(store), run, o, nullptr);
    } catch (const trainer::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("not refused");
  };
  for (const char* name : {"lock", "journal.jsonl"}) {
    write_file(outside, "keep me");
    const fs::path dir = mlf::journal_dir(tmp / name);
    fs::create_directories(dir);
    fs::create_symlink(outside, dir / name);
    const std::string why = refusal(tmp / name);
    EXPECT_NE(why.find((dir / name).string() + " is a symbolic link"), std::string::npos) << why;
    EXPECT_EQ(read_file(outside), "keep me") << name;
  }
  fs::create_directories(tmp / "outside-dir");
  fs::create_directories(tmp / "linked");
  fs::create_symlink(tmp / "outside-dir", mlf::journal_dir(tmp / "linked"));
  EXPECT_NE(refusal(tmp / "linked").find("mlflow is a symbolic link"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(tmp / "outside-dir"));

  // sent.json's temporary and rejected.jsonl: the run goes on, nothing lands outside.
  const fs::path dir = mlf::journal_dir(tmp / "run");
  fs::create_directories(dir);
  fs::create_symlink(outside, dir / "sent.json.tmp");
  fs::create_symlink(outside, dir / "rejected.jsonl");
  {
    mlf::Exporter e(mlf::open_backend(store), tmp / "run", o, nullptr);
    e.record({{"op", "start"}, {"experiment", "e"}, {"run_name", "r"}, {"tracking_uri", store}});
    e.record({{"op", "batch"}, {"params", json::array({json::array({"p", "1"})})}});
    e.record({{"op", "batch"}, {"params", json::array({json::array({"p", "2"})})}});  // a changed param: refused
    e.metrics(points(3));
    EXPECT_EQ(e.close(1.0), 0);
  }
  EXPECT_EQ(read_file(outside), "keep me");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir / "sent.json")));
  EXPECT_EQ(mlf::read_progress(dir, store).seq, 4);
}

// `trainer mlflow sync` of a run directory whose journal is a link: refused (exit 2) naming
// it, the file it leads to neither cut nor appended to.
TEST(MlflowJournal, SyncRefusesAJournalThatIsALink) {
  TempDir tmp;
  {
    auto e = file_exporter(tmp);
    e->metrics(points(3));
    e->close(1.0);  // no end record: sync would mark the run FAILED, appending to the journal
  }
  const fs::path journal = mlf::journal_dir(tmp.str()) / "journal.jsonl";
  fs::rename(journal, tmp / "outside.jsonl");
  std::ofstream(tmp / "outside.jsonl", std::ios::app) << "{\"seq\":3,\"op\":\"batch\",\"metr";  // cut short
  const std::string before = read_file(tmp / "outside.jsonl");
  fs::create_symlink(tmp / "outside.jsonl", journal);
  std::ostringstream out, err;
  EXPECT_EQ(mlf::sync_run_dir(tmp.str(), "", out, err), 2) << out.str() << err.str();
  EXPECT_NE(err.str().find(journal.string() + " is a symbolic link"), std::string::npos) << err.str();
  EXPECT_EQ(read_file(tmp / "outside.jsonl"), before);
}

using trainer::testing::ScriptedServer;

TEST(MlflowRest, ServerErrorsAreTransientAndRefusalsAreRejected) {
  ScriptedServer server(
      {{503, "{}"},
       {429, "{}"},
       {500, "<html>gateway</html>"},
       {401, "{\"error_code\":\"UNAUTHENTICATED\"}"},
       {400, "{\"error_code\":\"INVALID_PARAMETER_VALUE\",\"message\":\"Changing param values is not allowed\"}"},
       {200, "{}"}});
  mlf::Credentials cred;
  cred.token = "secret-token";
  auto b = mlf::open_backend(server.uri(), cred);
  auto expect = [&](auto error_type, const std::string& text) {
    try {
      b->log_batch("r1", {{"train/loss", std::nan(""), 1000, 3}}, {{"p", "v"}}, {});
      ADD_FAILURE() << "no error; expected " << text;
    } catch (const decltype(error_type)& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong error type: " << e.what();
    }
  };
  expect(mlf::TransientError(""), "HTTP 503");
  expect(mlf::TransientError(""), "Retry-After 7");
  expect(mlf::TransientError(""), "HTTP 500");
  expect(mlf::TransientError(""), "MLFLOW_TRACKING_TOKEN");
  expect(mlf::RejectedError(""), "Changing param values is not allowed");
  b->log_batch("r1", {{"train/loss", std::nan(""), 1000, 3}}, {{"p", "v"}}, {});
  ASSERT_EQ(server.requests.size(), 6u);
  const std::string& req = server.requests.back();
  EXPECT_EQ(req.rfind("POST /api/2.0/mlflow/runs/log-batch HTTP/1.1", 0), 0u) << req;
  EXPECT_NE(req.find("Content-Type: application/json"), std::string::npos) << req;
  EXPECT_NE(req.find("Authorization: Bearer secret-token"), std::string::npos) << req;
  const json body = json::parse(req.substr(req.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["run_id"], "r1");
  EXPECT_EQ(body["metrics"][0]["value"], "NaN");
  EXPECT_EQ(body["metrics"][0]["timestamp"], 1000);
  EXPECT_EQ(body["metrics"][0]["step"], 3);
  EXPECT_EQ(body["params"][0]["key"], "p");
}

TEST(MlflowRest, TheExporterRetriesAfter503And429AndSendsEachRecordOnce) {
  ScriptedServer server({{503, "{}"},
                         {200, "{\"experiment\":{\"experiment_id\":\"3\",\"lifecycle_stage\":\"active\"}}"},
                         {200, "{}"},  // runs/search: none with this journal id
                         {200, "{\"run\":{\"info\":{\"run_id\":\"r9\",\"experiment_id\":\"3\"}}}"},
                         {429, "{}"},
                         {200, "{}"},    // log-batch
                         {200, "{}"}});  // runs/update
  TempDir tmp;
  mlf::ExportOptions o;
  o.flush_interval_s = 0.01;
  std::int64_t left = -1;
  {
    mlf::Exporter e(mlf::open_backend(server.uri()), tmp.str(), o, nullptr);
    e.record({{"op", "start"},
              {"experiment", "e"},
              {"run_name", "r"},
              {"journal_id", "j1"},
              {"tracking_uri", server.uri()}});
    e.metrics(points(5));
    e.record({{"op", "end"}, {"status", "FINISHED"}, {"end_time", 5}});
    left = e.close(30.0);
    EXPECT_EQ(e.metrics_sent(), 5);
  }
  EXPECT_EQ(left, 0);
  std::vector<std::string> lines;
  for (const auto& r : server.requests) lines.push_back(r.substr(0, r.find(" HTTP/1.1")));
  EXPECT_EQ(lines,
            (std::vector<std::string>{"GET /api/2.0/mlflow/experiments/get-by-name?experiment_name=e",
                                      "GET /api/2.0/mlflow/experiments/get-by-name?experiment_name=e",
                                      "POST /api/2.0/mlflow/runs/search", "POST /api/2.0/mlflow/runs/create",
                                      "POST /api/2.0/mlflow/runs/log-batch", "POST /api/2.0/mlflow/runs/log-batch",
                                      "POST /api/2.0/mlflow/runs/update"}));
  EXPECT_NE(server.requests[3].find("\"trainer.journal_id\""), std::string::npos);
  const auto p = mlf::read_progress(mlf::journal_dir(tmp.str()), server.uri());
  EXPECT_EQ(p.run_id, "r9");
  EXPECT_EQ(p.seq, 3);
}

TEST(MlflowRest, BasicAuthFromUserAndPassword) {
  ScriptedServer server({{200, "{\"experiment\":{\"experiment_id\":\"7\",\"lifecycle_stage\":\"active\"}}"}});
  mlf::Credentials cred;
  cred.username = "ana";
  cred.password = "pw";
  EXPECT_EQ(mlf::open_backend(server.uri(), cred)->experiment_id("e x"), "7");
  ASSERT_EQ(server.requests.size(), 1u);
  EXPECT_EQ(server.requests[0].rfind("GET /api/2.0/mlflow/experiments/get-by-name?experiment_name=e%20x ", 0), 0u)
      << server.requests[0];
  EXPECT_NE(server.requests[0].find("Authorization: Basic YW5hOnB3"), std::string::npos) << server.requests[0];
}

TEST(MlflowRest, ADeletedExperimentIsRefusedSayingHowToRestoreIt) {
  ScriptedServer server({{200, "{\"experiment\":{\"experiment_id\":\"7\",\"lifecycle_stage\":\"deleted\"}}"}});
  try {
    mlf::open_backend(server.uri())->experiment_id("old");
    FAIL() << "accepted";
  } catch (const mlf::RejectedError& e) {
    EXPECT_NE(std::string(e.what()).find("restore"), std::string::npos) << e.what();
  }
}

// ---- a journal from someone else: `trainer mlflow sync` treats it as untrusted ----------

/// Sets (or unsets, for nullopt) an environment variable for the scope; restores it after.
class EnvVar {
 public:
  EnvVar(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvVar() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

/// No credentials and no tracking URI in the environment, whatever the caller's is.
struct CleanMlflowEnv {
  EnvVar uri{"MLFLOW_TRACKING_URI", std::nullopt};
  EnvVar token{"MLFLOW_TRACKING_TOKEN", std::nullopt};
  EnvVar user{"MLFLOW_TRACKING_USERNAME", std::nullopt};
  EnvVar password{"MLFLOW_TRACKING_PASSWORD", std::nullopt};
};

/// Writes `records` (numbered from 1) as the journal of `run_dir`.
void write_journal(const std::string& run_dir, std::vector<json> records) {
  std::string text;
  for (std::size_t i = 0; i < records.size(); ++i) {
    records[i]["seq"] = static_cast<std::int64_t>(i + 1);
    text += records[i].dump() + "\n";
  }
  write_file((mlf::journal_dir(run_dir) / "journal.jsonl").string(), text);
}

json start_record(const std::string& uri) {
  return {{"op", "start"}, {"experiment", "e"}, {"run_name", "r"}, {"journal_id", "j1"}, {"tracking_uri", uri}};
}

json end_record() { return {{"op", "end"}, {"status", "FINISHED"}, {"end_time", 5}}; }

/// Every regular file under `dir` (none when it does not exist).
std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file()) out.push_back(it->path().string());
  }
  return out;
}

struct SyncResult {
  int code = 0;
  std::string out, err;
};

SyncResult sync(const std::string& run_dir, const std::string& uri = "") {
  SyncResult r;
  std::ostringstream out, err;
  r.code = mlf::sync_run_dir(run_dir, uri, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

/// A run directory <tmp>/run whose journal sends to the file store <tmp>/mlruns, with a
/// file outside it (<tmp>/secret.txt) that the journal must not reach.
class UntrustedJournal : public ::testing::Test {
 protected:
  TempDir tmp_;
  CleanMlflowEnv env_;
  const std::string run_ = tmp_ / "run";
  const std::string store_ = "file://" + (tmp_ / "mlruns");
  const std::string secret_ = tmp_ / "secret.txt";

  void SetUp() override {
    write_file(secret_, "not for MLflow\n");
    write_file(run_ + "/config.toml", "[run]\n");
    // The store exists, as after the run that wrote the journal: sync writes a file store the
    // journal alone names only where one already is.
    mlf::open_backend(store_)->experiment_id("e");
  }
  /// <tmp>/<name> holding a journal of a start and a batch of `metric` (1 at step 1), sent to
  /// the store: a run this one may have resumed. Returns its path.
  std::string previous_run(const std::string& name, const std::string& metric) const {
    const std::string dir = tmp_ / name;
    write_journal(dir, {start_record(store_),
                        {{"op", "batch"}, {"metrics", json::array({json::array({metric, 1.0, 1000, 1})})}}});
    return dir;
  }
  /// The record a run resumed from `previous` starts its journal with.
  static json continue_record(const std::string& uri, const std::string& previous) {
    json cont = start_record(uri);
    cont["op"] = "continue";
    cont["previous_run_dir"] = previous;
    return cont;
  }
  /// The journal file and the line of the record that sync names, as it names them.
  std::string line(int n) const {
    return (mlf::journal_dir(run_) / "journal.jsonl").string() + ":" + std::to_string(n);
  }
  /// Nothing of the journal reached the store: no run was created, no file copied.
  void expect_nothing_sent() const {
    const fs::path root = tmp_ / "mlruns";
    for (const auto& f : files_under(root)) {
      EXPECT_EQ(f.find("/artifacts/"), std::string::npos) << f;
      EXPECT_EQ(f.find("/metrics/"), std::string::npos) << f;
      // <root>/<experiment>/meta.yaml are experiments; a run's is a level down.
      const fs::path rel = fs::path(f).lexically_relative(root);
      const auto parts = std::distance(rel.begin(), rel.end());
      EXPECT_LT(parts, 3) << "a run was created: " << f;
    }
    EXPECT_TRUE(mlf::read_progress(mlf::journal_dir(run_), store_).run_id.empty());
  }
};

TEST_F(UntrustedJournal, AnArtifactSourceOutsideTheRunDirectoryIsRefusedNamingItsLine) {
  for (const std::string& file :
       {std::string("../secret.txt"), secret_, std::string("../../../../../../../etc/passwd")}) {
    write_journal(run_,
                  {start_record(store_), {{"op", "artifact"}, {"file", file}, {"path", "stolen.txt"}}, end_record()});
    const SyncResult r = sync(run_);
    EXPECT_EQ(r.code, 2) << file << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(line(2)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("inside the run directory"), std::string::npos) << r.err;
    expect_nothing_sent();
  }
}

TEST_F(UntrustedJournal, AnArtifactSourceSymlinkedOutOfTheRunDirectoryIsRefused) {
  fs::create_symlink(secret_, run_ + "/link.toml");
  write_journal(
      run_, {start_record(store_), {{"op", "artifact"}, {"file", "link.toml"}, {"path", "config.toml"}}, end_record()});
  const SyncResult r = sync(run_);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(line(2)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(secret_), std::string::npos) << r.err;  // where it leads
  expect_nothing_sent();
}

TEST_F(UntrustedJournal, AnArtifactDestinationThatIsNotARelativePathIsRefused) {
  for (const std::string path : {"../x", "a/../../x", "/abs/x", "a//b", "./x", ""}) {
    write_journal(run_,
                  {start_record(store_), {{"op", "artifact"}, {"file", "config.toml"}, {"path", path}}, end_record()});
    const SyncResult r = sync(run_);
    EXPECT_EQ(r.code, 2) << "'" << path << "'\n" << r.out << r.err;
    EXPECT_NE(r.err.find(line(2)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("artifact path '" + path + "'"), std::string::npos) << r.err;
    expect_nothing_sent();
  }
}

TEST_F(UntrustedJournal, KeysAreValidatedAgainAsOnTheWayIn) {
  const std::vector<json> bad_batches{
      {{"op", "batch"}, {"metrics", json::array({json::array({"../../../../escape", 1.0, 1000, 1})})}},
      {{"op", "batch"}, {"metrics", json::array({json::array({"odd|key", 1.0, 1000, 1})})}},
      {{"op", "batch"}, {"params", json::array({json::array({"/etc/x", "v"})})}},
      {{"op", "batch"}, {"tags", json::array({json::array({"a/../../b", "v"})})}},
      {{"op", "batch"}, {"params", json::array({json::array({"p", std::string(mlf::kMaxParamValueLength + 1, 'v')})})}},
  };
  for (const auto& batch : bad_batches) {
    write_journal(run_, {start_record(store_), batch, end_record()});
    const SyncResult r = sync(run_);
    EXPECT_EQ(r.code, 2) << batch.dump().substr(0, 200) << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(line(2)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("not valid in MLflow"), std::string::npos) << r.err;
    expect_nothing_sent();
    EXPECT_FALSE(fs::exists(tmp_ / "escape"));
  }
  // The error names the key and what is allowed.
  write_journal(run_, {start_record(store_), bad_batches[1], end_record()});
  const SyncResult r = sync(run_);
  EXPECT_NE(r.err.find("metric key 'odd|key'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("letters, digits"), std::string::npos) << r.err;
}

TEST_F(UntrustedJournal, AValidJournalIsStillSent) {
  write_journal(run_, {start_record(store_),
                       {{"op", "batch"}, {"metrics", json::array({json::array({"train/loss", 0.5, 1000, 1})})}},
                       {{"op", "artifact"}, {"file", "config.toml"}, {"path", "configs/config.toml"}},
                       end_record()});
  const SyncResult r = sync(run_);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto p = mlf::read_progress(mlf::journal_dir(run_), store_);
  ASSERT_FALSE(p.run_id.empty());
  const std::string run = tmp_ / ("mlruns/" + p.experiment_id + "/" + p.run_id);
  EXPECT_EQ(read_file(run + "/artifacts/configs/config.toml"), "[run]\n");
  EXPECT_EQ(read_file(run + "/metrics/train/loss"), "1000 0.5 1\n");
}

TEST_F(UntrustedJournal, AFileStoreNamedByTheJournalAloneIsWrittenOnlyWhereOneIs) {
  const std::string elsewhere = tmp_ / "home/.config";
  write_journal(run_, {start_record("file://" + elsewhere), end_record()});
  const SyncResult r = sync(run_);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(line(1)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is not an MLflow file store"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--tracking-uri file://" + elsewhere), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp_ / "home")) << "sync created a directory the journal named";
  // Named by the user, it is created and written.
  const SyncResult named = sync(run_, "file://" + elsewhere);
  EXPECT_EQ(named.code, 0) << named.out << named.err;
  EXPECT_TRUE(fs::exists(elsewhere + "/0/meta.yaml"));
}

/// Writes RUN_DIR/mlflow/sent.json saying that `uri` acknowledged the journal's first
/// `records` records, into the run `run_id` (experiment 7, artifacts at `artifact_uri`).
void write_sent(const std::string& run_dir, const std::string& uri, int records, const std::string& run_id,
                const std::string& artifact_uri) {
  const std::string journal = read_file((mlf::journal_dir(run_dir) / "journal.jsonl").string());
  std::size_t offset = 0;
  for (int i = 0; i < records; ++i) offset = journal.find('\n', offset) + 1;
  const json sent{{"destinations",
                   {{mlf::canonical_uri(uri),
                     {{"seq", records},
                      {"offset", offset},
                      {"experiment_id", "7"},
                      {"run_id", run_id},
                      {"artifact_uri", artifact_uri}}}}}};
  write_file((mlf::journal_dir(run_dir) / "sent.json").string(), sent.dump());
}

TEST_F(UntrustedJournal, ARunThatSentJsonNamesAndTheDestinationLacksStopsSyncNamingSentJson) {
  write_journal(run_, {start_record(store_),
                       {{"op", "batch"}, {"metrics", json::array({json::array({"train/loss", 0.5, 1000, 1})})}},
                       end_record()});
  const std::string run_id(32, 'a');
  write_sent(run_, store_, 1, run_id, "file://" + secret_);
  const SyncResult r = sync(run_);
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("sent.json"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(run_id), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("remove its entry"), std::string::npos) << r.err;
  EXPECT_EQ(mlf::read_progress(mlf::journal_dir(run_), store_).seq, 1) << "a record was marked as delivered";
  for (const auto& f : files_under(tmp_ / "mlruns")) EXPECT_EQ(f.find("/metrics/"), std::string::npos) << f;
}

// sent.json came with the run directory: one whose entry holds what trainer never writes (a
// seq that is text, a negative offset, an entry that is not an object, a FIFO) stops sync with
// exit code 2 naming the file, the entry's key and the value; nothing is sent.
TEST_F(UntrustedJournal, ASentJsonThatTrainerCouldNotHaveWrittenIsRefusedNamingIt) {
  write_journal(run_, {start_record(store_), end_record()});
  const std::string key = mlf::canonical_uri(store_);
  const fs::path sent = mlf::journal_dir(run_) / "sent.json";
  const std::vector<std::pair<json, std::string>> cases = {
      {json{{"destinations", {{key, {{"seq", "one"}}}}}}, "has seq = \"one\", not a whole number"},
      {json{{"destinations", {{key, {{"seq", 1}, {"offset", -5}}}}}}, "has seq 1 and offset -5; both are 0 or more"},
      {json{{"destinations", {{key, json::array({1, 2})}}}}, "is [1,2], not an object"},
      {json{{"destinations", json::array({key})}}, "\"destinations\" is [\"" + key + "\"], not an object"},
      {json{{"destinations", {{key, {{"run_id", 7}}}}}}, "has run_id = 7, not a string"},
  };
  const auto store_before = files_under(tmp_ / "mlruns");
  for (const auto& [content, says] : cases) {
    SCOPED_TRACE(says);
    write_file(sent.string(), content.dump());
    const SyncResult r = sync(run_);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(sent.string()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    EXPECT_EQ(files_under(tmp_ / "mlruns"), store_before) << "sync sent something";
  }
  fs::remove(sent);
  ASSERT_EQ(::mkfifo(sent.c_str(), 0600), 0);
  const SyncResult r = sync(run_);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(sent.string() + " is not a regular file"), std::string::npos) << r.err;
}

TEST_F(UntrustedJournal, ArtifactsGoWhereTheDestinationSaysNotWhereSentJsonSays) {
  ScriptedServer server({{200,
                          "{\"run\":{\"info\":{\"run_id\":\"r9\",\"experiment_id\":\"3\",\"artifact_uri\":"
                          "\"mlflow-artifacts:/3/r9/artifacts\"}}}"},  // runs/get
                         {200, "{}"},                                  // the upload
                         {200, "{}"}});                                // runs/update
  write_journal(run_, {start_record(server.uri()),
                       {{"op", "artifact"}, {"file", "config.toml"}, {"path", "configs/config.toml"}},
                       end_record()});
  // The run is the journal's, but the artifact location is another run's.
  write_sent(run_, server.uri(), 1, "r9", "mlflow-artifacts:/1/victim/artifacts");
  const SyncResult r = sync(run_, server.uri());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  ASSERT_EQ(server.requests.size(), 3u);
  EXPECT_EQ(server.requests[0].rfind("GET /api/2.0/mlflow/runs/get?run_id=r9 HTTP/1.1", 0), 0u) << server.requests[0];
  EXPECT_EQ(server.requests[1].rfind("PUT /api/2.0/mlflow-artifacts/artifacts/3/r9/artifacts/configs/config.toml", 0),
            0u)
      << server.requests[1];
  for (const auto& req : server.requests) EXPECT_EQ(req.find("victim"), std::string::npos) << req;
}

TEST_F(UntrustedJournal, AnAnswerWithoutTheRunStopsSyncInsteadOfPassingRecordsOver) {
  ScriptedServer server({{200, "{}"}});  // runs/get: no run in the answer
  write_journal(run_, {start_record(server.uri()),
                       {{"op", "batch"}, {"metrics", json::array({json::array({"train/loss", 0.5, 1000, 1})})}},
                       end_record()});
  write_sent(run_, server.uri(), 1, "r9", "mlflow-artifacts:/3/r9/artifacts");
  const SyncResult r = sync(run_, server.uri());
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("asking " + server.uri() + " for run r9"), std::string::npos) << r.err;
  EXPECT_EQ(mlf::read_progress(mlf::journal_dir(run_), server.uri()).seq, 1) << "a record was passed over";
  EXPECT_FALSE(fs::exists(mlf::journal_dir(run_) / "rejected.jsonl"));
}

TEST_F(UntrustedJournal, TheRunResumedFromSendsItsArtifactsWhereTheDestinationSays) {
  // The plugin's side: this run resumed from <tmp>/other, a directory from elsewhere whose
  // sent.json names its run's artifact location as another run's.
  ScriptedServer server({{200,
                          "{\"run\":{\"info\":{\"run_id\":\"r9\",\"experiment_id\":\"3\",\"artifact_uri\":"
                          "\"mlflow-artifacts:/3/r9/artifacts\"}}}"},  // runs/get, before other's artifact
                         {200, "{}"},                                  // the upload
                         {200,
                          "{\"run\":{\"info\":{\"run_id\":\"r9\",\"experiment_id\":\"3\",\"artifact_uri\":"
                          "\"mlflow-artifacts:/3/r9/artifacts\"}}}"},  // runs/get, for this run's continue
                         {200, "{}"}});                                // runs/update: RUNNING
  const std::string other = tmp_ / "other";
  write_file(other + "/config.toml", "[run]\n");
  write_journal(other, {start_record(server.uri()),
                        {{"op", "artifact"}, {"file", "config.toml"}, {"path", "configs/config.toml"}}});
  write_sent(other, server.uri(), 1, "r9", "mlflow-artifacts:/1/victim/artifacts");
  json cont = continue_record(server.uri(), other);
  mlf::ExportOptions o;
  o.background = false;
  {
    mlf::Exporter e(mlf::open_backend(server.uri()), run_, o, nullptr);
    e.record(cont);
    EXPECT_EQ(e.close(0.0), 0);
  }
  ASSERT_EQ(server.requests.size(), 4u);
  EXPECT_EQ(server.requests[0].rfind("GET /api/2.0/mlflow/runs/get?run_id=r9 HTTP/1.1", 0), 0u) << server.requests[0];
  EXPECT_EQ(server.requests[1].rfind("PUT /api/2.0/mlflow-artifacts/artifacts/3/r9/artifacts/configs/config.toml", 0),
            0u)
      << server.requests[1];
  for (const auto& req : server.requests) EXPECT_EQ(req.find("victim"), std::string::npos) << req;
}

TEST_F(UntrustedJournal, TheRunResumedFromWaitsWhileAnotherProcessSendsItsJournal) {
  // A `trainer mlflow sync` of the directory this run resumed from, running meanwhile: its
  // records are not sent twice, nor this run's into a run of its own.
  const std::string other = previous_run("other", "before");
  json cont = continue_record(store_, other);
  std::ostringstream log_text;
  auto log = std::make_shared<spdlog::logger>("held", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_text));
  mlf::ExportOptions o;
  o.background = false;
  {
    mlf::JournalLock sync_holds(mlf::journal_dir(other));
    mlf::Exporter e(mlf::open_backend(store_), run_, o, log);
    e.record(cont);
    EXPECT_EQ(e.close(0.0), 1);
  }
  EXPECT_NE(log_text.str().find("is being written by another process"), std::string::npos) << log_text.str();
  expect_nothing_sent();
  // Once it is free, both arrive in one run.
  std::ostringstream out, err;
  ASSERT_EQ(mlf::sync_run_dir(run_, "", out, err, {other}), 0) << out.str() << err.str();
  EXPECT_EQ(mlf::read_progress(mlf::journal_dir(other), store_).run_id,
            mlf::read_progress(mlf::journal_dir(run_), store_).run_id);
}

TEST_F(UntrustedJournal, AContinueRecordPointingAtAnotherRunDirectoryIsRefused) {
  // The other directory holds a journal of its own, and the MLflow run it says it sent to.
  const std::string other = previous_run("other", "leaked");
  json cont = continue_record(store_, other);
  write_journal(run_, {cont, end_record()});
  const SyncResult r = sync(run_);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(line(1)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(other), std::string::npos) << r.err;
  expect_nothing_sent();
  EXPECT_TRUE(mlf::read_progress(mlf::journal_dir(other), store_).run_id.empty());  // its journal was not sent
}

TEST_F(UntrustedJournal, AContinueRecordMayNameARunDirectoryTheUserGave) {
  const std::string other = previous_run("other", "before");
  json cont = continue_record(store_, other);
  write_journal(
      run_, {cont, {{"op", "batch"}, {"metrics", json::array({json::array({"after", 2.0, 2000, 2})})}}, end_record()});
  std::ostringstream out, err;
  ASSERT_EQ(mlf::sync_run_dir(run_, "", out, err, {other}), 0) << out.str() << err.str();
  // One MLflow run: the previous directory's records first, then this one's.
  const auto p = mlf::read_progress(mlf::journal_dir(run_), store_);
  EXPECT_EQ(mlf::read_progress(mlf::journal_dir(other), store_).run_id, p.run_id);
  const std::string run = tmp_ / ("mlruns/" + p.experiment_id + "/" + p.run_id);
  EXPECT_EQ(read_file(run + "/metrics/before"), "1000 1 1\n");
  EXPECT_EQ(read_file(run + "/metrics/after"), "2000 2 2\n");
}

TEST_F(UntrustedJournal, ABadRecordInTheNamedPreviousRunDirectoryIsRefusedToo) {
  const std::string other = tmp_ / "other";
  write_journal(other, {start_record(store_), {{"op", "artifact"}, {"file", "../secret.txt"}, {"path", "stolen.txt"}}});
  json cont = continue_record(store_, other);
  write_journal(run_, {cont, end_record()});
  std::ostringstream out, err;
  EXPECT_EQ(mlf::sync_run_dir(run_, "", out, err, {other}), 2) << out.str() << err.str();
  EXPECT_NE(err.str().find((mlf::journal_dir(other) / "journal.jsonl").string() + ":2"), std::string::npos)
      << err.str();
  expect_nothing_sent();
}

TEST_F(UntrustedJournal, ThePluginsOwnSenderKeepsABadRecordAsideUnsent) {
  const std::string store = "file:" + (tmp_ / "mlruns");
  mlf::ExportOptions o;
  o.background = false;
  mlf::Exporter e(mlf::open_backend(store), run_, o, nullptr);
  e.record(start_record(store));
  e.record({{"op", "artifact"}, {"file", "config.toml"}, {"path", "../../x"}});
  e.record({{"op", "artifact"}, {"file", secret_}, {"path", "x"}});
  e.record(end_record());
  EXPECT_EQ(e.close(1.0), 0);
  EXPECT_EQ(read_lines((mlf::journal_dir(run_) / "rejected.jsonl").string()).size(), 2u);
  for (const auto& f : files_under(tmp_.str())) {
    EXPECT_NE(fs::path(f).filename(), "x") << f;
    EXPECT_EQ(f.find("/artifacts/"), std::string::npos) << f;
  }
}

TEST_F(UntrustedJournal, ThePluginFollowsOnlyTheContinueOfTheRunItResumed) {
  // <tmp>/older was resumed into <tmp>/other, which this run resumed; nothing of <tmp>/other was
  // sent. Its continue record names <tmp>/older: a directory this run's user never named.
  const std::string older = previous_run("older", "older");
  const std::string other = tmp_ / "other";
  write_journal(other, {continue_record(store_, older),
                        {{"op", "batch"}, {"metrics", json::array({json::array({"other", 2.0, 2000, 2})})}}});
  const json cont = continue_record(store_, other);
  std::ostringstream log_text;
  auto log = std::make_shared<spdlog::logger>("nested", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_text));
  mlf::ExportOptions o;
  o.background = false;
  std::int64_t left = 0;
  {
    mlf::Exporter e(mlf::open_backend(store_), run_, o, log);
    e.record(cont);
    e.metrics({{"train/loss", 0.5, 3000, 3}});
    left = e.close(0.0);
  }
  EXPECT_EQ(left, 2);
  EXPECT_NE(log_text.str().find("after this run ends, send them in order with trainer mlflow sync " + run_ + " " +
                                other + " " + older),
            std::string::npos)
      << log_text.str();
  EXPECT_EQ(log_text.str().find("fix that, then"), std::string::npos) << log_text.str();
  EXPECT_TRUE(mlf::read_progress(mlf::journal_dir(older), store_).run_id.empty()) << "the older journal was sent";
  expect_nothing_sent();
  // Named by the user, in order, all three arrive in one run.
  std::ostringstream out, err;
  ASSERT_EQ(mlf::sync_run_dir(run_, "", out, err, {other, older}), 0) << out.str() << err.str();
  const auto p = mlf::read_progress(mlf::journal_dir(run_), store_);
  const std::string run = tmp_ / ("mlruns/" + p.experiment_id + "/" + p.run_id);
  EXPECT_EQ(read_file(run + "/metrics/older"), "1000 1 1\n");
  EXPECT_EQ(read_file(run + "/metrics/other"), "2000 2 2\n");
  EXPECT_EQ(read_file(run + "/metrics/train/loss"), "3000 0.5 3\n");
}

TEST_F(UntrustedJournal, CredentialsGoOnlyToATrackingUriTheUserGave) {
  ScriptedServer server({{200, "{}"}, {200, "{}"}, {200, "{}"}});
  write_journal(run_, {start_record(server.uri()), end_record()});
  EnvVar token("MLFLOW_TRACKING_TOKEN", std::string("secret-token"));
  {
    // The user's server is another one: which did they mean? Neither is sent to.
    EnvVar user_uri("MLFLOW_TRACKING_URI", std::string("http://127.0.0.1:9"));
    const SyncResult r = sync(run_);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(server.uri()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("http://127.0.0.1:9"), std::string::npos) << r.err;
  }
  {
    // No URI from the user: the journal's alone does not get the token.
    const SyncResult r = sync(run_);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(server.uri()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--tracking-uri"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("MLFLOW_TRACKING_URI"), std::string::npos) << r.err;
  }
  {
    EnvVar user("MLFLOW_TRACKING_USERNAME", std::string("ana"));
    EnvVar password("MLFLOW_TRACKING_PASSWORD", std::string("pw"));
    EnvVar no_token("MLFLOW_TRACKING_TOKEN", std::nullopt);
    const SyncResult r = sync(run_);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
  }
  EXPECT_TRUE(server.requests.empty()) << server.requests.front();
}

TEST_F(UntrustedJournal, CredentialsGoToTheServerTheUserNamed) {
  ScriptedServer server({{200, "{\"experiment\":{\"experiment_id\":\"3\",\"lifecycle_stage\":\"active\"}}"},
                         {200, "{}"},  // runs/search
                         {200, "{\"run\":{\"info\":{\"run_id\":\"r9\",\"experiment_id\":\"3\"}}}"},
                         {200, "{}"}});  // runs/update
  write_journal(run_, {start_record(server.uri()), end_record()});
  EnvVar token("MLFLOW_TRACKING_TOKEN", std::string("secret-token"));
  EnvVar user_uri("MLFLOW_TRACKING_URI", server.uri());
  const SyncResult r = sync(run_);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  ASSERT_EQ(server.requests.size(), 4u);
  for (const auto& req : server.requests) EXPECT_NE(req.find("Authorization: Bearer secret-token"), std::string::npos);
}

// The plugin journals its tracking URI without the credentials in it; the user gives them
// again as docs/metrics.md says, in MLFLOW_TRACKING_URI's userinfo. That is the journal's
// server: the records go there with those credentials, and nothing sync prints holds them.
TEST_F(UntrustedJournal, CredentialsInMlflowTrackingUriGoToTheServerTheJournalNamesWithoutThem) {
  ScriptedServer server({{200, "{\"experiment\":{\"experiment_id\":\"3\",\"lifecycle_stage\":\"active\"}}"},
                         {200, "{}"},  // runs/search
                         {200, "{\"run\":{\"info\":{\"run_id\":\"r9\",\"experiment_id\":\"3\"}}}"},
                         {200, "{}"}});  // runs/update
  write_journal(run_, {start_record(server.uri()), end_record()});
  EnvVar user_uri("MLFLOW_TRACKING_URI", "http://ana:pw-hunter2@127.0.0.1:" + std::to_string(server.port()));
  const SyncResult r = sync(run_);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  ASSERT_EQ(server.requests.size(), 4u);
  for (const auto& req : server.requests) {
    EXPECT_NE(req.find("Authorization: Basic YW5hOnB3LWh1bnRlcjI="), std::string::npos) << req;  // ana:pw-hunter2
    EXPECT_EQ(req.find("hunter2"), std::string::npos) << req;
  }
  EXPECT_EQ((r.out + r.err).find("hunter2"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("to " + server.uri()), std::string::npos) << r.out;
  // Acknowledged under the URI without them: a later sync finds it.
  EXPECT_EQ(mlf::read_progress(mlf::journal_dir(run_), server.uri()).seq, 2);
  EXPECT_EQ(read_file((mlf::journal_dir(run_) / "sent.json").string()).find("hunter2"), std::string::npos);
}

// A continue record sent.json says the destination has is not checked again, whether or not
// the URI the user gives holds credentials.
TEST_F(UntrustedJournal, AnAcknowledgedContinueIsPassedWhenTheUsersUriHoldsCredentials) {
  ScriptedServer server({{200, "{\"run\":{\"info\":{\"run_id\":\"r9\",\"experiment_id\":\"3\"}}}"},  // runs/get
                         {200, "{}"},                                                                // log-batch
                         {200, "{}"}});                                                              // runs/update
  const std::string other = previous_run("other", "before");
  write_journal(run_, {continue_record(server.uri(), other),
                       {{"op", "batch"}, {"metrics", json::array({json::array({"after", 2.0, 2000, 2})})}},
                       end_record()});
  write_sent(run_, server.uri(), 1, "r9", "mlflow-artifacts:/3/r9/artifacts");
  const SyncResult r = sync(run_, "http://ana:pw-hunter2@127.0.0.1:" + std::to_string(server.port()));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  ASSERT_EQ(server.requests.size(), 3u);
  for (const auto& req : server.requests) {
    EXPECT_NE(req.find("Authorization: Basic YW5hOnB3LWh1bnRlcjI="), std::string::npos) << req;
  }
  EXPECT_EQ((r.out + r.err).find("hunter2"), std::string::npos) << r.out << r.err;
  EXPECT_EQ(mlf::read_progress(mlf::journal_dir(run_), server.uri()).seq, 3);
}

// Whatever sync refuses, it names tracking URIs without their userinfo: the user's, and the
// journal's (an older trainer journaled it whole).
TEST_F(UntrustedJournal, SyncNamesNoCredentialsWhenItRefusesATrackingUri) {
  const std::string journal_uri = "http://bob:journal-secret@127.0.0.1:9";
  write_journal(run_, {start_record(journal_uri), end_record()});
  {
    // Another server than the journal's: which did they mean?
    EnvVar user_uri("MLFLOW_TRACKING_URI", std::string("http://ana:pw-hunter2@127.0.0.1:8"));
    const SyncResult r = sync(run_);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("names the tracking URI http://127.0.0.1:9 "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("MLFLOW_TRACKING_URI is http://127.0.0.1:8:"), std::string::npos) << r.err;
    for (const char* secret : {"hunter2", "journal-secret", "ana:", "bob:"}) {
      EXPECT_EQ((r.out + r.err).find(secret), std::string::npos) << secret << ": " << r.err;
    }
  }
  {
    // The journal's URI alone, with a token set: refused, naming the URI without its userinfo.
    EnvVar token("MLFLOW_TRACKING_TOKEN", std::string("secret-token"));
    const SyncResult r = sync(run_);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("--tracking-uri http://127.0.0.1:9 "), std::string::npos) << r.err;
    EXPECT_EQ((r.out + r.err).find("journal-secret"), std::string::npos) << r.err;
  }
}

// ---- a refused run: nothing after it is marked as delivered -------------------------------

/// What MLflow answers to experiments/get-by-name for an active experiment 3.
const std::pair<int, std::string> kActive{200,
                                          "{\"experiment\":{\"experiment_id\":\"3\",\"lifecycle_stage\":\"active\"}}"};

/// A journal of a start, two metric batches and an end, refused at the run's start by a first
/// sync (`refusal`: the answers up to and including the refusal), then sent by a second one
/// after the fix. Returns the first sync's result; `requests` gets what the server received.
SyncResult refused_then_sent(const std::string& run, std::vector<std::pair<int, std::string>> refusal,
                             std::vector<std::string>& requests, SyncResult& second, const std::string& location = "") {
  std::vector<std::pair<int, std::string>> answers = std::move(refusal);
  for (const auto& a : std::vector<std::pair<int, std::string>>{
           kActive,
           {200, "{}"},  // runs/search: none with this journal id
           {200, "{\"run\":{\"info\":{\"run_id\":\"r9\",\"experiment_id\":\"3\"}}}"},
           {200, "{}"},     // log-batch
           {200, "{}"},     // log-batch
           {200, "{}"}}) {  // runs/update
    answers.push_back(a);
  }
  ScriptedServer server(answers, location);
  auto batch = [](double v) {
    return json{{"op", "batch"}, {"metrics", json::array({json::array({"train/loss", v, 1000, 1})})}};
  };
  write_journal(run, {start_record(server.uri()), batch(0.5), batch(0.25), end_record()});
  SyncResult first = sync(run, server.uri());
  const auto p = mlf::read_progress(mlf::journal_dir(run), server.uri());
  EXPECT_EQ(p.seq, 0) << "a record after the refused start was marked as delivered";
  EXPECT_EQ(p.offset, 0);
  EXPECT_TRUE(p.run_id.empty());
  EXPECT_FALSE(fs::exists(mlf::journal_dir(run) / "rejected.jsonl"));
  second = sync(run, server.uri());
  requests = server.requests;
  EXPECT_EQ(mlf::read_progress(mlf::journal_dir(run), server.uri()).seq, 4);
  return first;
}

/// How many of `requests` were `line` (`POST /api/2.0/mlflow/runs/log-batch`).
int count(const std::vector<std::string>& requests, const std::string& line) {
  int n = 0;
  for (const auto& r : requests) n += r.rfind(line + " HTTP/1.1", 0) == 0 ? 1 : 0;
  return n;
}

/// The second sync delivered every record once.
void expect_delivered_once(const std::vector<std::string>& requests, const SyncResult& second) {
  EXPECT_EQ(second.code, 0) << second.out << second.err;
  EXPECT_EQ(count(requests, "POST /api/2.0/mlflow/runs/create"), 2);  // the refused one, then the run
  EXPECT_EQ(count(requests, "POST /api/2.0/mlflow/runs/log-batch"), 2);
  EXPECT_EQ(count(requests, "POST /api/2.0/mlflow/runs/update"), 1);
}

TEST_F(UntrustedJournal, ARunStartRefusedWithA404FromAProxyStopsSyncAndALaterSyncSendsEachRecordOnce) {
  std::vector<std::string> requests;
  SyncResult second;
  const SyncResult r =
      refused_then_sent(run_, {kActive, {200, "{}"}, {404, "<html>Not Found</html>"}}, requests, second);
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("HTTP 404"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/api/2.0/mlflow/runs/create"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("path prefix"), std::string::npos) << r.err;
  expect_delivered_once(requests, second);
}

TEST_F(UntrustedJournal, ARedirectIsNotFollowedAndSyncNamesTheUriToUse) {
  std::vector<std::string> requests;
  SyncResult second;
  const SyncResult r = refused_then_sent(run_, {kActive, {200, "{}"}, {302, ""}}, requests, second,
                                         "https://mlflow.example/team/api/2.0/mlflow/runs/create");
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("HTTP 302"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("use https://mlflow.example/team as the tracking URI"), std::string::npos) << r.err;
  expect_delivered_once(requests, second);
}

TEST_F(UntrustedJournal, RefusedCredentialsStopSyncSayingWhatToCheck) {
  std::vector<std::string> requests;
  SyncResult second;
  const SyncResult r = refused_then_sent(run_, {kActive, {200, "{}"}, {403, "{\"error_code\":\"PERMISSION_DENIED\"}"}},
                                         requests, second);
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("HTTP 403"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("MLFLOW_TRACKING_TOKEN"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fix that, then run this again"), std::string::npos) << r.err;
  expect_delivered_once(requests, second);
}

TEST_F(UntrustedJournal, ADeletedExperimentStopsSyncAtTheStartAndARestoreLetsTheNextSyncSendAll) {
  std::vector<std::string> requests;
  SyncResult second;
  const SyncResult r = refused_then_sent(
      run_, {{200, "{\"experiment\":{\"experiment_id\":\"3\",\"lifecycle_stage\":\"deleted\"}}"}}, requests, second);
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("is deleted"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restore"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(line(1)), std::string::npos) << r.err;  // the start record's journal line
  EXPECT_EQ(count(requests, "POST /api/2.0/mlflow/runs/log-batch"), 2);
  EXPECT_EQ(count(requests, "POST /api/2.0/mlflow/runs/update"), 1);
  EXPECT_EQ(second.code, 0) << second.out << second.err;
}

TEST_F(UntrustedJournal, ARunStartRefusedDuringTrainingKeepsEveryRecordForALaterSync) {
  // The plugin's exporter, on the training process's side: its start is refused (a proxy's
  // 404) at the first try and at each retry; nothing after it may be marked as delivered.
  std::vector<std::pair<int, std::string>> refusals;
  for (int attempt = 0; attempt < 8; ++attempt) {
    for (const auto& a :
         std::vector<std::pair<int, std::string>>{kActive, {200, "{}"}, {404, "<html>Not Found</html>"}}) {
      refusals.push_back(a);
    }
  }
  std::ostringstream log_text;
  auto log =
      std::make_shared<spdlog::logger>("refused-start", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_text));
  std::int64_t left = 0;
  {
    ScriptedServer proxy(refusals);
    mlf::ExportOptions o;
    o.background = false;
    mlf::Exporter e(mlf::open_backend(proxy.uri()), run_, o, log);
    e.record(start_record(proxy.uri()));
    e.metrics({{"train/loss", 0.5, 1000, 1}});
    e.metrics({{"train/loss", 0.25, 2000, 2}});
    e.record(end_record());
    left = e.close(0.0);
    const auto p = mlf::read_progress(mlf::journal_dir(run_), proxy.uri());
    EXPECT_EQ(p.seq, 0) << "a record after the refused start was marked as delivered";
    EXPECT_EQ(p.offset, 0);
  }
  EXPECT_EQ(left, 4);
  EXPECT_FALSE(fs::exists(mlf::journal_dir(run_) / "rejected.jsonl"));
  EXPECT_NE(log_text.str().find("HTTP 404"), std::string::npos) << log_text.str();
  EXPECT_NE(log_text.str().find("path prefix"), std::string::npos) << log_text.str();
  EXPECT_NE(log_text.str().find("then `trainer mlflow sync " + run_ + "`"), std::string::npos) << log_text.str();
  // After the fix (the right URI), sync sends each record once, into one run.
  ScriptedServer server({kActive,
                         {200, "{}"},  // runs/search: none with this journal id
                         {200, "{\"run\":{\"info\":{\"run_id\":\"r9\",\"experiment_id\":\"3\"}}}"},
                         {200, "{}"},
                         {200, "{}"},
                         {200, "{}"}});
  const SyncResult r = sync(run_, server.uri());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(count(server.requests, "POST /api/2.0/mlflow/runs/create"), 1);
  EXPECT_EQ(count(server.requests, "POST /api/2.0/mlflow/runs/log-batch"), 2);
  EXPECT_EQ(count(server.requests, "POST /api/2.0/mlflow/runs/update"), 1);
}

/// Lowers the process's file size limit (RLIMIT_FSIZE) to `bytes` for the scope, with SIGXFSZ
/// ignored: a write past it fails with EFBIG, as on a full disk.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lower = old_;
    lower.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &lower), 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
};

TEST(MlflowJournal, AFailedJournalWriteIsReportedAndTheNextRecordIsALineOfItsOwn) {
  TempDir tmp;
  std::ostringstream log_text;
  auto log =
      std::make_shared<spdlog::logger>("journal-full", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_text));
  const std::string store = "file:" + (tmp / "mlruns");
  const fs::path journal = mlf::journal_dir(tmp.str()) / "journal.jsonl";
  mlf::ExportOptions o;
  o.background = false;
  {
    mlf::Exporter e(mlf::open_backend(store), tmp.str(), o, log);
    e.record({{"op", "start"}, {"experiment", "e"}, {"run_name", "r"}, {"tracking_uri", store}});
    {
      // Room for part of the next record only (1000 metrics, tens of kilobytes).
      FileSizeLimit limit(fs::file_size(journal) + 100);
      e.metrics(points(1000));
    }
    e.metrics(points(3, 2));
    e.record({{"op", "end"}, {"status", "FINISHED"}, {"end_time", 5}});
    EXPECT_EQ(e.close(1.0), 0);
  }
  EXPECT_NE(log_text.str().find("cannot append record 2 to " + journal.string()), std::string::npos) << log_text.str();
  EXPECT_NE(log_text.str().find("(errno " + std::to_string(EFBIG) + ")"), std::string::npos) << log_text.str();
  const auto lines = read_lines(journal.string());
  std::vector<std::string> ops;
  for (const auto& l : lines) {
    const json rec = json::parse(l, nullptr, false);
    ASSERT_TRUE(rec.is_object()) << "not one record: " << l.substr(0, 200);
    ops.push_back(rec["op"].get<std::string>());
    EXPECT_EQ(rec["seq"], static_cast<int>(ops.size()));
  }
  EXPECT_EQ(ops, (std::vector<std::string>{"start", "batch", "end"}));  // the record that failed is lost
  EXPECT_EQ(json::parse(lines[1])["metrics"].size(), 3u);
}

// ---- the file store writes nothing outside its root ----------------------------------------

class FileStoreRoot : public ::testing::Test {
 protected:
  TempDir tmp_;
  const std::string outside_ = tmp_ / "outside";
  std::unique_ptr<mlf::Backend> store_ = mlf::open_backend("file:" + (tmp_ / "a/b/mlruns"));
  mlf::RunInfo run_;

  void SetUp() override {
    fs::create_directories(outside_);
    write_file(tmp_ / "artifact.txt", "data\n");
    run_ = store_->create_run(store_->experiment_id("e"), "r", "u", 1, {});
  }
  fs::path run_dir() const { return fs::path(tmp_ / "a/b/mlruns") / run_.experiment_id / run_.run_id; }
  void expect_outside_untouched() const { EXPECT_TRUE(files_under(outside_).empty()) << files_under(outside_).front(); }
};

TEST_F(FileStoreRoot, KeysThatClimbOutOfTheRunAreRefused) {
  const std::string up = "../../../../../../outside/x";  // from <run>/metrics to <tmp>
  EXPECT_THROW(store_->log_batch(run_.run_id, {{up, 1.0, 1, 1}}, {}, {}), mlf::RejectedError);
  EXPECT_THROW(store_->log_batch(run_.run_id, {}, {{up, "v"}}, {}), mlf::RejectedError);
  EXPECT_THROW(store_->log_batch(run_.run_id, {}, {}, {{up, "v"}}), mlf::RejectedError);
  EXPECT_THROW(store_->create_run(run_.experiment_id, "r2", "u", 1, {{up, "v"}}), mlf::RejectedError);
  expect_outside_untouched();
}

TEST_F(FileStoreRoot, ArtifactPathsThatClimbOutOrAreAbsoluteAreRefused) {
  for (const std::string& path :
       {std::string("../../../../../../outside/x"), outside_ + "/x", std::string("a/../../../../../../outside/x")}) {
    EXPECT_THROW(store_->log_artifact(run_, tmp_ / "artifact.txt", path), mlf::RejectedError) << path;
  }
  expect_outside_untouched();
}

TEST_F(FileStoreRoot, RunAndExperimentIdsThatNameOtherDirectoriesAreRefused) {
  write_file(outside_ + "/meta.yaml", "run_id: x\nexperiment_id: '0'\nstatus: 1\n");
  const std::string before = read_file(outside_ + "/meta.yaml");
  // A run is looked for in each experiment's directory, an experiment in the root.
  for (const std::string& id : {std::string("../../../../outside"), outside_}) {
    EXPECT_THROW(store_->update_run(id, "FAILED", 5), mlf::RejectedError) << id;
    EXPECT_THROW(store_->log_batch(id, {{"m", 1.0, 1, 1}}, {}, {}), mlf::RejectedError) << id;
  }
  for (const std::string& id : {std::string("../../../outside"), outside_}) {
    EXPECT_THROW(store_->create_run(id, "r", "u", 1, {}), mlf::RejectedError) << id;
  }
  EXPECT_EQ(read_file(outside_ + "/meta.yaml"), before);
  EXPECT_EQ(files_under(outside_).size(), 1u);
}

TEST_F(FileStoreRoot, ASymlinkOutOfTheStoreIsNotFollowed) {
  // A file of the store that is a link out of it (a dangling one: writing would create its
  // target) is not written through ...
  fs::create_symlink(outside_ + "/m", run_dir() / "metrics" / "m");
  EXPECT_THROW(store_->log_batch(run_.run_id, {{"m", 1.0, 1, 1}}, {}, {}), mlf::RejectedError);
  fs::create_symlink(outside_ + "/t", run_dir() / "tags" / "t.tmp");
  EXPECT_THROW(store_->log_batch(run_.run_id, {}, {}, {{"t", "v"}}), mlf::RejectedError);
  // ... nor a directory that is one.
  fs::remove_all(run_dir() / "artifacts");
  fs::create_directory_symlink(outside_, run_dir() / "artifacts");
  EXPECT_THROW(store_->log_artifact(run_, tmp_ / "artifact.txt", "x.txt"), mlf::RejectedError);
  fs::remove_all(run_dir() / "metrics");
  fs::create_directory_symlink(outside_, run_dir() / "metrics");
  EXPECT_THROW(store_->log_batch(run_.run_id, {{"n", 1.0, 1, 1}}, {}, {}), mlf::RejectedError);
  expect_outside_untouched();
}

// A FIFO planted as a metric file in a shared store would block an open for writing until a
// reader came: it is refused at once, naming it. (Run in a child with a time limit, so that an
// open that waits fails the test instead of hanging it.)
TEST_F(FileStoreRoot, AFifoPlantedAsAMetricFileIsRefusedNamingItNotWaitedOn) {
  const std::string fifo = (run_dir() / "metrics" / "m").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const BoundedChild c = run_bounded(
      [&] {
        try {
          store_->log_batch(run_.run_id, {{"m", 1.0, 1, 1}}, {}, {});
          return std::string("the metric was written into the FIFO");
        } catch (const mlf::RejectedError& e) {
          const std::string m = e.what();
          return m.find(fifo + " is a FIFO") != std::string::npos ? std::string() : "refused as: " + m;
        }
      },
      30);
  EXPECT_EQ(c.code, 0) << (c.code == 128 + SIGALRM ? "the open waited on the FIFO (killed by the time limit)" : c.text);
  EXPECT_EQ(c.text, "");
  // The run's other metrics are still written.
  store_->log_batch(run_.run_id, {{"n", 2.0, 1, 1}}, {}, {});
  EXPECT_EQ(read_file((run_dir() / "metrics/n").string()), "1 2 1\n");
}

// An artifact is copied into a temporary created new: a link at the temporary's name (to
// another file of the store, which the store's own check lets pass) is replaced, never
// written through, and so is one planted again between its removal and the copy.
TEST_F(FileStoreRoot, ALinkAtAnArtifactsTemporaryIsNeverWrittenThrough) {
  store_->log_batch(run_.run_id, {}, {{"victim", "keep"}}, {});
  const fs::path victim = run_dir() / "params" / "victim";
  const fs::path tmp = run_dir() / "artifacts" / "x.txt.tmp";
  fs::create_symlink(victim, tmp);
  store_->log_artifact(run_, tmp_ / "artifact.txt", "x.txt");
  EXPECT_EQ(read_file((run_dir() / "artifacts" / "x.txt").string()), "data\n");
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp)));
  EXPECT_EQ(read_file(victim.string()), "keep");
  // Another process plants the link again and again while artifacts are logged: each copy is
  // written whole, or refused; none goes through the link.
  std::atomic<bool> stop{false};
  std::thread planter([&] {
    while (!stop) ::symlink(victim.c_str(), tmp.c_str());
  });
  int written = 0, refused = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (int i = 0; i < 3000 && std::chrono::steady_clock::now() < until && read_file(victim.string()) == "keep"; ++i) {
    try {
      store_->log_artifact(run_, tmp_ / "artifact.txt", "x.txt");
      ++written;
    } catch (const mlf::RejectedError&) {
      ++refused;
    }
  }
  stop = true;
  planter.join();
  EXPECT_EQ(read_file(victim.string()), "keep") << written << " written, " << refused << " refused";
  EXPECT_EQ(read_file((run_dir() / "artifacts" / "x.txt").string()), "data\n");
  expect_outside_untouched();
}

TEST_F(FileStoreRoot, ValidKeysAndPathsStillNestAsMlflowDoes) {
  store_->log_batch(run_.run_id, {{"train/loss", 0.25, 7, 2}}, {{"training.batch_size", "32"}}, {{"team", "vision"}});
  store_->log_artifact(run_, tmp_ / "artifact.txt", "checkpoints/step_1.pt");
  EXPECT_EQ(read_file((run_dir() / "metrics/train/loss").string()), "7 0.25 2\n");
  EXPECT_EQ(read_file((run_dir() / "params/training.batch_size").string()), "32");
  EXPECT_EQ(read_file((run_dir() / "tags/team").string()), "vision");
  EXPECT_EQ(read_file((run_dir() / "artifacts/checkpoints/step_1.pt").string()), "data\n");
}

}  // namespace
