// `trainer mlflow sync RUN_DIR`: what a run's journal holds that its destination has not
// acknowledged, sent; a run whose process died is marked FAILED.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "journal_io.h"
#include "mlflow_export.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainer::mlflow {

using detail::drop_incomplete_tail;
using detail::for_each_record;
using detail::kJournal;
using detail::kRejected;

int sync_run_dir(const std::string& run_dir, const std::string& uri_override, std::ostream& out, std::ostream& err) {
  const fs::path dir = journal_dir(run_dir);
  if (!fs::is_directory(run_dir)) {
    err << "trainer mlflow sync: " << run_dir << " is not a directory\n";
    return 2;
  }
  if (!fs::exists(dir / kJournal)) {
    err << "trainer mlflow sync: " << run_dir << " has no MLflow journal (" << (dir / kJournal).string()
        << "): the run did not use the mlflow plugin\n";
    return 2;
  }
  std::unique_ptr<JournalLock> lock;
  try {
    lock = std::make_unique<JournalLock>(dir);
  } catch (const std::exception& e) {
    err << "trainer mlflow sync: " << e.what() << "; a running trainer sends its records itself: sync after it ends\n";
    return 2;
  }
  if (const std::int64_t cut = drop_incomplete_tail(dir / kJournal); cut > 0) {
    out << "trainer mlflow sync: dropped the journal's last record, cut short when its process died (" << cut
        << " bytes)\n";
  }
  // The destination the run used, unless another is asked for; whether the run was closed.
  std::string uri = uri_override;
  bool closed = false;
  std::int64_t last_seq = 0;
  for_each_record(dir / kJournal, 0, [&](const std::string& line, std::int64_t) {
    const json rec = json::parse(line, nullptr, false);
    if (!rec.is_object()) return true;
    const std::string op = rec.value("op", std::string());
    if (op == "start" || op == "continue") {
      if (uri_override.empty()) uri = rec.value("tracking_uri", uri);
      closed = false;
    }
    if (op == "end") closed = true;
    last_seq = std::max(last_seq, rec.value("seq", std::int64_t{0}));
    return true;
  });
  if (uri.empty()) {
    err << "trainer mlflow sync: the journal of " << run_dir << " names no tracking URI; pass --tracking-uri\n";
    return 2;
  }
  auto log = spdlog::get("trainer-mlflow-sync");
  if (!log) {
    log = spdlog::stderr_color_mt("trainer-mlflow-sync");
    log->set_pattern("trainer mlflow sync: %v");
  }
  std::unique_ptr<Backend> backend;
  try {
    backend = open_backend(uri, Credentials::from_env());
  } catch (const std::exception& e) {
    err << "trainer mlflow sync: " << e.what() << "\n";
    return 2;
  }
  if (!closed) {
    // Its process is gone (the lock was free) and never closed the run: a kill -9, a crash, the
    // machine going down. The run is marked FAILED at the journal's last write.
    std::error_code ec;
    const auto mtime = fs::last_write_time(dir / kJournal, ec);
    std::int64_t end = now_ms();
    if (!ec) {
      end = std::chrono::duration_cast<std::chrono::milliseconds>(
                (mtime - fs::file_time_type::clock::now()) + std::chrono::system_clock::now().time_since_epoch())
                .count();
    }
    std::ofstream j(dir / kJournal, std::ios::app | std::ios::binary);
    const std::string reason =
        "the trainer process ended without closing the run (killed, or the machine went down); marked FAILED by "
        "trainer mlflow sync";
    j << json{{"seq", last_seq + 1}, {"op", "batch"}, {"tags", json::array({json::array({"trainer.end_reason", reason})})}}
             .dump()
      << "\n"
      << json{{"seq", last_seq + 2}, {"op", "end"}, {"status", "FAILED"}, {"end_time", end}}.dump() << "\n";
    out << "trainer mlflow sync: " << run_dir << ": the run was not closed by its process; marking it FAILED\n";
  }
  Sender sender(*backend, dir, log);
  std::string error;
  const auto [records, metrics] = sender.pending();
  const bool ok = sender.send_pending(&error);
  const auto [left, left_metrics] = sender.pending();
  out << "trainer mlflow sync: sent " << sender.sent_records() << " of " << records << " records (" << sender.sent_metrics()
      << " of " << metrics << " metrics) to " << uri;
  if (!sender.progress().run_id.empty()) out << ", run " << sender.progress().run_id;
  out << "\n";
  if (sender.rejected_records() > 0) {
    out << "trainer mlflow sync: " << sender.rejected_records() << " records were refused; they are kept in "
        << (dir / kRejected).string() << "\n";
  }
  if (!ok) {
    err << "trainer mlflow sync: " << error << "; " << left << " records (" << left_metrics
        << " metrics) are left in the journal: run this again when the server answers\n";
    return 3;
  }
  return 0;
}

}  // namespace trainer::mlflow
