// The MLflow client without a server: MLflow's key rules, the journal's batching, and what
// happens when nothing answers.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "mlflow_client.h"
#include "mlflow_export.h"
#include "support/test_util.h"

namespace {

using nlohmann::json;
using trainer::testing::read_lines;
using trainer::testing::TempDir;
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

TEST(MlflowKeys, SpecialValuesAreMlflowsJsonStrings) {
  EXPECT_EQ(mlf::metric_value_json(std::nan("")), "\"NaN\"");
  EXPECT_EQ(mlf::metric_value_json(std::numeric_limits<double>::infinity()), "\"Infinity\"");
  EXPECT_EQ(mlf::metric_value_json(-std::numeric_limits<double>::infinity()), "\"-Infinity\"");
  EXPECT_EQ(mlf::metric_value_json(0.5), "0.5");
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

std::vector<json> journal(const std::string& run_dir) {
  std::vector<json> out;
  for (const auto& l : read_lines((mlf::journal_dir(run_dir) / "journal.jsonl").string())) out.push_back(json::parse(l));
  return out;
}

std::vector<mlf::Metric> points(int n, int step = 1) {
  std::vector<mlf::Metric> out;
  for (int i = 0; i < n; ++i) out.push_back({"m/" + std::to_string(i % 7), double(i), 1000 + i, step});
  return out;
}

TEST(MlflowJournal, MetricsAreBatchedWithinMlflowsLimitsAndInOrder) {
  TempDir tmp;
  const std::string store = "file:" + (tmp / "mlruns");
  {
    mlf::ExportOptions o;
    o.background = false;
    mlf::Exporter e(mlf::open_backend(store), tmp.str(), o, nullptr);
    e.record({{"op", "start"}, {"experiment", "e"}, {"run_name", "r"}, {"tracking_uri", store}});
    e.metrics(points(2500));
    e.record({{"op", "end"}, {"status", "FINISHED"}, {"end_time", 5}});
    EXPECT_EQ(e.close(1.0), 0);
    EXPECT_EQ(e.metrics_sent(), 2500);
  }
  const auto recs = journal(tmp.str());
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
  const auto recs = journal(tmp.str());
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
  const std::string store = "file:" + (tmp / "mlruns");
  mlf::ExportOptions o;
  o.background = false;
  mlf::Exporter e(mlf::open_backend(store), tmp.str(), o, nullptr);
  e.record({{"op", "start"}, {"experiment", "e"}, {"run_name", "r"}, {"tracking_uri", store}});
  e.record({{"op", "batch"}, {"params", json::array({json::array({"p", "1"})})}});
  e.record({{"op", "batch"}, {"params", json::array({json::array({"p", "2"})})}});  // a changed param: refused
  e.metrics(points(3));
  EXPECT_EQ(e.close(1.0), 0);
  EXPECT_EQ(e.metrics_sent(), 3);
  const auto rejected = read_lines((mlf::journal_dir(tmp.str()) / "rejected.jsonl").string());
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_NE(rejected[0].find("\"2\""), std::string::npos);
}

TEST(MlflowJournal, ASecondWriterIsRefusedNamingTheFirst) {
  TempDir tmp;
  mlf::JournalLock first(mlf::journal_dir(tmp.str()));
  EXPECT_FALSE(mlf::JournalLock::is_free(mlf::journal_dir(tmp.str())));
  try {
    mlf::JournalLock second(mlf::journal_dir(tmp.str()));
    FAIL() << "two writers";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(::getpid())), std::string::npos) << e.what();
  }
}

}  // namespace
