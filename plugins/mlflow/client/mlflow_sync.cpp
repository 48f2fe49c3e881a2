// `trainer mlflow sync RUN_DIR`: what a run's journal holds that its destination has not
// acknowledged, sent; a run whose process died is marked FAILED. The journal may come from
// someone else (a copied run directory): it is checked whole before anything is sent, and
// credentials go only to a tracking URI the user gave.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "journal_check.h"
#include "journal_io.h"
#include "mlflow_export.h"
#include "trainer/durable_file.h"
#include "trainer/secrets.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainer::mlflow {

using detail::drop_incomplete_tail;
using detail::for_each_record;
using detail::kJournal;
using detail::kRejected;

namespace {

/// What the check of a journal found.
struct Scan {
  std::string uri;        ///< the tracking URI of its last start or continue record
  std::string uri_where;  ///< that record's file:line
  bool closed = false;    ///< an end record after the last start or continue
  std::int64_t last_seq = 0;
  struct Continue {
    std::string where;
    fs::path previous;
    std::int64_t end_offset = 0;
  };
  std::vector<Continue> continues;
};

/// Checks every record of `run_dir`'s journal as the plugin checks what it writes
/// (validate_record; an artifact's file inside `run_dir`). Throws JournalError naming the
/// first that fails.
Scan scan_journal(const fs::path& run_dir) {
  Scan s;
  const fs::path journal = journal_dir(run_dir.string()) / kJournal;
  std::int64_t line_no = 0;
  for_each_record(journal, 0, [&](const std::string& line, std::int64_t end) {
    const std::string where = journal.string() + ":" + std::to_string(++line_no);
    const json rec = json::parse(line, nullptr, false);
    validate_record(rec, where);
    const std::string op = rec["op"].get<std::string>();
    if (op == "start" || op == "continue") {
      if (rec.contains("tracking_uri") && !rec["tracking_uri"].get_ref<const std::string&>().empty()) {
        s.uri = rec["tracking_uri"].get<std::string>();
        s.uri_where = where;
      }
      s.closed = false;
    }
    if (op == "continue") s.continues.push_back({where, rec["previous_run_dir"].get<std::string>(), end});
    if (op == "artifact") artifact_source(run_dir, rec["file"].get<std::string>(), where);
    if (op == "end") s.closed = true;
    if (rec.contains("seq")) s.last_seq = std::max(s.last_seq, rec["seq"].get<std::int64_t>());
    return true;
  });
  return s;
}

/// The continue records of `scan` that `uri` has not acknowledged may name only `run_dir`
/// or a directory of `trusted` (canonical): sync would send that directory's journal first
/// and continue the MLflow run its sent.json names. The journals they name are checked too.
void check_continues(const fs::path& run_dir, const Scan& scan, const std::string& uri,
                     const std::vector<fs::path>& trusted, std::vector<fs::path>& seen) {
  const std::int64_t acknowledged = read_progress(journal_dir(run_dir.string()), uri).offset;
  const fs::path own = fs::weakly_canonical(fs::absolute(run_dir));
  for (const auto& c : scan.continues) {
    if (c.end_offset <= acknowledged) continue;
    const fs::path prev = fs::weakly_canonical(c.previous);
    if (prev == own) continue;
    if (std::find(trusted.begin(), trusted.end(), prev) == trusted.end()) {
      throw JournalError(c.where + ": a continue record names the run directory " + prev.string() +
                         ", which was not given on the command line (sync would send its journal and continue the "
                         "MLflow run its sent.json names); if it is the run this one resumed, name it: trainer "
                         "mlflow sync " +
                         own.string() + " " + prev.string());
    }
    if (std::find(seen.begin(), seen.end(), prev) != seen.end()) continue;
    seen.push_back(prev);
    if (fs::exists(journal_dir(prev.string()) / kJournal)) {
      check_continues(prev, scan_journal(prev), uri, trusted, seen);
    }
  }
}

/// Two tracking URIs that name the same destination (file: URIs made absolute, a trailing
/// `/` dropped, userinfo cut: the journal keeps its URI without credentials, the user gives
/// them in the URI).
bool same_uri(const std::string& a, const std::string& b) {
  auto norm = [](std::string u) {
    u = canonical_uri(u);
    while (u.size() > 1 && u.back() == '/') u.pop_back();
    return u;
  };
  return norm(a) == norm(b);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

int sync_run_dir(const std::string& run_dir, const std::string& uri_override, std::ostream& out, std::ostream& err,
                 const std::vector<std::string>& previous_run_dirs) {
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
  std::vector<fs::path> trusted;
  for (const auto& d : previous_run_dirs) {
    if (!fs::is_directory(d)) {
      err << "trainer mlflow sync: " << d << " (a previous run directory) is not a directory\n";
      return 2;
    }
    trusted.push_back(fs::weakly_canonical(fs::absolute(d)));
  }
  std::unique_ptr<JournalLock> lock;
  std::int64_t cut = 0;
  try {
    lock = std::make_unique<JournalLock>(dir);
  } catch (const UsageError& e) {  // a link or a FIFO planted in mlflow/: refused, naming it
    err << "trainer mlflow sync: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "trainer mlflow sync: " << e.what() << "; a running trainer sends its records itself: sync after it ends\n";
    return 2;
  }
  try {
    cut = drop_incomplete_tail(dir / kJournal);
  } catch (const UsageError& e) {
    err << "trainer mlflow sync: " << e.what() << "\n";
    return 2;
  }
  if (cut > 0) {
    out << "trainer mlflow sync: dropped the journal's last record, cut short when its process died (" << cut
        << " bytes)\n";
  }
  // The journal is checked whole before anything is sent or written: a run directory may come
  // from someone else.
  const char* untrusted =
      "; the journal holds what trainer does not write (edited, or not a trainer journal): nothing was sent\n";
  Scan scan;
  try {
    scan = scan_journal(run_dir);
  } catch (const JournalError& e) {
    err << "trainer mlflow sync: " << e.what() << untrusted;
    return 2;
  }
  // The destination: the user's (--tracking-uri, else $MLFLOW_TRACKING_URI), else the
  // journal's. Credentials go only to a URI the user gave: a journal may name any server.
  Credentials credentials = Credentials::from_env();
  const std::string env_uri = env("MLFLOW_TRACKING_URI");
  std::string uri = uri_override;
  if (uri.empty() && !env_uri.empty()) {
    if (!scan.uri.empty() && !same_uri(scan.uri, env_uri)) {
      err << "trainer mlflow sync: the journal of " << run_dir << " names the tracking URI "
          << without_userinfo(scan.uri) << " (" << scan.uri_where << "), MLFLOW_TRACKING_URI is "
          << without_userinfo(env_uri) << ": pass --tracking-uri with the one to send to\n";
      return 2;
    }
    uri = env_uri;
  }
  if (uri.empty()) {
    if (scan.uri.empty()) {
      err << "trainer mlflow sync: the journal of " << run_dir << " names no tracking URI; pass --tracking-uri\n";
      return 2;
    }
    uri = scan.uri;
    const std::string shown = without_userinfo(uri);  // an older trainer's journal kept it whole
    const bool remote = uri.rfind("file:", 0) != 0;
    const std::string set = !credentials.token.empty() ? "MLFLOW_TRACKING_TOKEN"
                            : !credentials.username.empty() || !credentials.password.empty()
                                ? "MLFLOW_TRACKING_USERNAME/PASSWORD"
                                : "";
    if (!remote) {
      // A file store is written where the journal says only where one already is (its Default
      // experiment's 0/meta.yaml, as MLflow and trainer create it): a copied journal may name
      // any directory.
      const fs::path root = canonical_uri(uri).substr(7);
      if (!fs::exists(root / "0" / "meta.yaml")) {
        err << "trainer mlflow sync: the tracking URI " << shown << " comes from the journal of " << run_dir
            << " alone (" << scan.uri_where << ") and " << root.string()
            << " is not an MLflow file store (no 0/meta.yaml); sync creates one only where you say: pass "
               "--tracking-uri "
            << shown << " or set MLFLOW_TRACKING_URI=" << shown << "\n";
        return 2;
      }
    }
    if (remote && !set.empty()) {
      err << "trainer mlflow sync: " << set << " is set, and the tracking URI " << shown
          << " comes from the journal of " << run_dir << " alone (" << scan.uri_where
          << "); credentials are sent only to a server you name, as a copied run directory may name any: pass "
             "--tracking-uri "
          << shown << " or set MLFLOW_TRACKING_URI=" << shown << "\n";
      return 2;
    }
    credentials = {};
  }
  try {
    std::vector<fs::path> seen;
    check_continues(run_dir, scan, uri, trusted, seen);
  } catch (const UsageError& e) {  // a continue record refused, or sent.json holding what trainer never writes
    err << "trainer mlflow sync: " << e.what() << "; nothing was sent\n";
    return 2;
  }
  auto log = spdlog::get("trainer-mlflow-sync");
  if (!log) {
    log = spdlog::stderr_color_mt("trainer-mlflow-sync");
    log->set_pattern("trainer mlflow sync: %v");
  }
  std::unique_ptr<Backend> backend;
  try {
    backend = open_backend(uri, credentials);
  } catch (const std::exception& e) {
    err << "trainer mlflow sync: " << e.what() << "\n";
    return 2;
  }
  if (!scan.closed) {
    // Its process is gone (the lock was free) and never closed the run: a kill -9, a crash, the
    // machine going down. The run is marked FAILED at the journal's last write.
    std::error_code ec;
    const auto mtime = fs::last_write_time(dir / kJournal, ec);
    std::int64_t end = now_ms();
    if (!ec) {
      end = std::chrono::duration_cast<std::chrono::milliseconds>((mtime - fs::file_time_type::clock::now()) +
                                                                  std::chrono::system_clock::now().time_since_epoch())
                .count();
    }
    const std::string reason =
        "the trainer process ended without closing the run (killed, or the machine went down); marked FAILED by "
        "trainer mlflow sync";
    const std::string records =
        json{{"seq", scan.last_seq + 1},
             {"op", "batch"},
             {"tags", json::array({json::array({"trainer.end_reason", reason})})}}
            .dump() +
        "\n" + json{{"seq", scan.last_seq + 2}, {"op", "end"}, {"status", "FAILED"}, {"end_time", end}}.dump() + "\n";
    const std::string journal = (dir / kJournal).string();
    write_fully(open_for_append(journal).get(), records.data(), records.size(), journal);
    out << "trainer mlflow sync: " << run_dir << ": the run was not closed by its process; marking it FAILED\n";
  }
  Sender sender(*backend, dir, log);
  sender.trust_only(trusted);
  std::string error;
  const auto [records, metrics] = sender.pending();
  bool ok = false;
  try {
    ok = sender.send_pending(&error);
  } catch (const JournalError& e) {
    err << "trainer mlflow sync: " << e.what() << "; " << sender.sent_records()
        << " records before it were sent, it and the rest were not\n";
    return 2;
  }
  const auto [left, left_metrics] = sender.pending();
  out << "trainer mlflow sync: sent " << sender.sent_records() << " of " << records << " records ("
      << sender.sent_metrics() << " of " << metrics << " metrics) to " << without_userinfo(uri);
  if (!sender.progress().run_id.empty()) out << ", run " << sender.progress().run_id;
  out << "\n";
  if (sender.rejected_records() > 0) {
    out << "trainer mlflow sync: " << sender.rejected_records() << " records were refused; they are kept in "
        << (dir / kRejected).string() << "\n";
  }
  if (!ok && sender.blocked()) {
    err << "trainer mlflow sync: " << error << "; " << left << " records (" << left_metrics
        << " metrics) are left in the journal, from the one refused on: fix that, then run this again (each is sent "
           "once)\n";
    return 3;
  }
  if (!ok) {
    err << "trainer mlflow sync: " << error << "; " << left << " records (" << left_metrics
        << " metrics) are left in the journal: run this again when the server answers\n";
    return 3;
  }
  return 0;
}

}  // namespace trainer::mlflow
