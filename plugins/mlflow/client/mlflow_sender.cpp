// The sender: a journal's records to one backend, in order, from what the destination has
// acknowledged (sent.json); the journal and sent.json may come from someone else.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "journal_check.h"
#include "journal_io.h"
#include "mlflow_export.h"
#include "trainer/durable_file.h"
#include "trainer/error.h"
#include "trainer/json.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainer::mlflow {

using detail::for_each_record;
using detail::kJournal;
using detail::kRejected;
using detail::seq_of;

namespace {

constexpr const char* kSent = "sent.json";

/// A journal's metric value: a number or one of json_nonfinite_name's names (journal_check
/// refuses a file with anything else).
double metric_value_from(const json& v) {
  if (v.is_number()) return v.get<double>();
  const auto named = v.is_string() ? json_nonfinite_value(v.get_ref<const std::string&>()) : std::nullopt;
  return named.value_or(std::numeric_limits<double>::quiet_NaN());
}

std::vector<KeyValue> key_values(const json& a) {
  std::vector<KeyValue> out;
  if (!a.is_array()) return out;
  for (const auto& kv : a) out.push_back({kv.at(0).get<std::string>(), kv.at(1).get<std::string>()});
  return out;
}

/// sent.json as an object; none there is an empty one. It may come with a run directory from
/// elsewhere: anything but a regular file (a FIFO would hold sync up) is refused naming it.
json read_json_file(const fs::path& p) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(p, ec);
  if (!fs::exists(st)) return json::object();
  TRAINER_CHECK_T(UsageError, fs::is_regular_file(st), p.string(),
                  " is not a regular file (a link, a FIFO or a folder); remove it to send the journal from its start");
  std::ifstream in(p);
  if (!in) return json::object();
  json j = json::parse(in, nullptr, false);
  return j.is_object() ? j : json::object();
}

/// sent.json's `name` of destination `key` when it is there, checked to be what trainer writes.
template <class T>
T progress_field(const json& d, const char* name, T fallback, const fs::path& file, const std::string& key) {
  if (!d.contains(name)) return fallback;
  const json& v = d[name];
  constexpr bool is_string = std::is_same_v<T, std::string>;
  TRAINER_CHECK_T(UsageError, is_string ? v.is_string() : v.is_number_integer(), file.string(), ": \"destinations\" \"",
                  key, "\" has ", name, " = ", v.dump(), ", not ", is_string ? "a string" : "a whole number",
                  "; remove the entry (or the file) to send the journal from its start");
  return v.get<T>();
}

void write_json_atomically(const fs::path& p, const json& j) { write_replacing(p.string(), j.dump(1) + "\n"); }

/// Keeps a refused record aside in rejected.jsonl (appended: never through a link planted there);
/// a record that cannot be kept is logged.
void keep_rejected(const fs::path& file, const std::string& line, spdlog::logger& log) {
  try {
    const std::string text = line + "\n";
    write_fully(open_for_append(file.string()).get(), text.data(), text.size(), file.string());
  } catch (const std::exception& e) {
    log.error("mlflow: the refused record was not kept: {}", e.what());
  }
}

}  // namespace

// ---- sender ------------------------------------------------------------------------------

Progress read_progress(const fs::path& dir, const std::string& uri) {
  const json all = read_json_file(dir / kSent);
  Progress p;
  const std::string key = canonical_uri(uri);
  const fs::path file = dir / kSent;
  if (!all.contains("destinations")) return p;
  TRAINER_CHECK_T(UsageError, all["destinations"].is_object(), file.string(), ": \"destinations\" is ",
                  all["destinations"].dump(), ", not an object; remove the file to send the journal from its start");
  if (!all["destinations"].contains(key)) return p;
  const json& d = all["destinations"][key];
  TRAINER_CHECK_T(UsageError, d.is_object(), file.string(), ": \"destinations\" \"", key, "\" is ", d.dump(),
                  ", not an object; remove the entry (or the file) to send the journal from its start");
  p.seq = progress_field(d, "seq", std::int64_t{0}, file, key);
  p.offset = progress_field(d, "offset", std::int64_t{0}, file, key);
  TRAINER_CHECK_T(UsageError, p.seq >= 0 && p.offset >= 0, file.string(), ": \"destinations\" \"", key, "\" has seq ",
                  p.seq, " and offset ", p.offset, "; both are 0 or more");
  p.experiment_id = progress_field(d, "experiment_id", std::string(), file, key);
  p.run_id = progress_field(d, "run_id", std::string(), file, key);
  p.artifact_uri = progress_field(d, "artifact_uri", std::string(), file, key);
  return p;
}

Sender::Sender(Backend& backend, fs::path dir, std::shared_ptr<spdlog::logger> log)
    : backend_(backend), dir_(std::move(dir)), log_(log ? std::move(log) : spdlog::default_logger()) {
  progress_ = read_progress(dir_, backend_.uri());
}

void Sender::save_progress() {
  // The file is this journal's: its one writer holds the lock, so what was read is current.
  if (sent_.is_null()) sent_ = read_json_file(dir_ / kSent);
  json& all = sent_;
  all["destinations"][canonical_uri(backend_.uri())] = {{"seq", progress_.seq},
                                                        {"offset", progress_.offset},
                                                        {"experiment_id", progress_.experiment_id},
                                                        {"run_id", progress_.run_id},
                                                        {"artifact_uri", progress_.artifact_uri}};
  write_json_atomically(dir_ / kSent, all);
}

std::pair<std::int64_t, std::int64_t> Sender::pending() const {
  std::int64_t records = 0, metrics = 0;
  for_each_record(dir_ / kJournal, progress_.offset, [&](const std::string& line, std::int64_t) {
    ++records;
    const json rec = json::parse(line, nullptr, false);
    if (rec.is_object() && rec.contains("metrics")) metrics += static_cast<std::int64_t>(rec["metrics"].size());
    return true;
  });
  return {records, metrics};
}

void Sender::trust_only(std::vector<fs::path> run_dirs) {
  strict_ = true;
  trusted_.clear();
  for (const auto& d : run_dirs) trusted_.push_back(fs::weakly_canonical(fs::absolute(d)));
}

namespace {

/// Lines of `journal` before byte `offset` (offsets always follow a newline).
std::int64_t lines_before(const fs::path& journal, std::int64_t offset) {
  std::ifstream in(journal, std::ios::binary);
  std::int64_t lines = 0;
  char buf[65536];
  while (offset > 0 && in) {
    in.read(buf, static_cast<std::streamsize>(std::min<std::int64_t>(offset, sizeof buf)));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    lines += std::count(buf, buf + n, '\n');
    offset -= n;
  }
  return lines;
}

}  // namespace

bool Sender::send_pending(std::string* error) {
  bool ok = true;
  blocked_ = false;
  // Untrusted journals are named by line in errors; the plugin's own by record.
  std::int64_t line_no = strict_ ? lines_before(dir_ / kJournal, progress_.offset) : 0;
  for_each_record(dir_ / kJournal, progress_.offset, [&](const std::string& line, std::int64_t end) {
    const json rec = json::parse(line, nullptr, false);
    ++line_no;
    const std::string where =
        (dir_ / kJournal).string() +
        (strict_ ? ":" + std::to_string(line_no) : " record " + std::to_string(seq_of(rec, progress_.seq + 1)));
    try {
      validate_record(rec, where);
      apply(rec, where);
      ++sent_records_;
      if (rec.contains("metrics")) sent_metrics_ += static_cast<std::int64_t>(rec["metrics"].size());
    } catch (const TransientError& e) {
      if (error) *error = e.what();
      blocked_ = dynamic_cast<const RefusedError*>(&e) != nullptr;
      ok = false;
      return false;
    } catch (const JournalError& e) {
      if (strict_) throw;
      ++rejected_;
      log_->error("mlflow: {}; not sent, kept in {}", e.what(), (dir_ / kRejected).string());
      keep_rejected(dir_ / kRejected, line, *log_);
    } catch (const std::exception& e) {
      const bool has_op = rec.is_object() && rec.contains("op") && rec["op"].is_string();
      const std::string op = has_op ? rec["op"].get<std::string>() : std::string();
      if (op == "start" || op == "continue") {
        // Every record after it belongs to that run: passing it over would mark them all as
        // delivered. Sending stops here; the record stays in the journal.
        if (error) {
          *error = backend_.uri() + " refused the run's " + op + " (" + where + "): " + e.what() +
                   "; nothing after it was sent";
        }
        blocked_ = true;
        ok = false;
        return false;
      }
      // Refused for what it holds: sending it again cannot help. Kept aside, reported, passed.
      ++rejected_;
      log_->error("mlflow: {} refused journal record {} ({}): {}; kept in {}", backend_.uri(), seq_of(rec, 0),
                  has_op ? rec["op"].get<std::string>() : std::string("?"), e.what(), (dir_ / kRejected).string());
      keep_rejected(dir_ / kRejected, line, *log_);
    }
    progress_.seq = seq_of(rec, progress_.seq + 1);
    progress_.offset = end;
    save_progress();
    return true;
  });
  return ok;
}

void Sender::confirm_run() {
  if (!(strict_ || nested_) || confirmed_ || progress_.run_id.empty()) return;
  // sent.json came with the run directory (sync's, or the one a resumed run resumed from), from
  // whoever wrote it: its run must exist at the destination, and where artifacts go is the
  // destination's answer, not the file's. Whatever stops the lookup stops sending: a record
  // passed over here would be marked as delivered.
  RunInfo run;
  try {
    run = backend_.get_run(progress_.run_id);
  } catch (const TransientError&) {
    throw;
  } catch (const RejectedError& e) {
    throw RefusedError((dir_ / kSent).string() + " says the journal's run at " + backend_.uri() + " is " +
                       progress_.run_id + ", which " + backend_.uri() + " does not have (" + e.what() +
                       "): sent.json does not belong to this destination's runs; remove its entry for " +
                       canonical_uri(backend_.uri()) + " to send the whole journal as a new run");
  } catch (const std::exception& e) {
    throw RefusedError("asking " + backend_.uri() + " for run " + progress_.run_id + " (named by " +
                       (dir_ / kSent).string() + ") failed: " + e.what());
  }
  if (run.run_id != progress_.run_id) {
    throw RefusedError(backend_.uri() + " answered run " + run.run_id + " when asked for " + progress_.run_id +
                       " (named by " + (dir_ / kSent).string() + ")");
  }
  progress_.experiment_id = run.experiment_id;
  progress_.artifact_uri = run.artifact_uri;
  confirmed_ = true;
}

void Sender::apply(const json& rec, const std::string& where) {
  const std::string op = rec.at("op").get<std::string>();
  const fs::path run_dir = dir_.parent_path();
  auto need_run = [&] {
    if (progress_.run_id.empty())
      throw RejectedError("no MLflow run to log to (the journal's start record was refused)");
    confirm_run();
  };
  auto create = [&] {
    const std::string exp = backend_.experiment_id(rec.at("experiment").get<std::string>());
    const std::string journal_id = rec.value("journal_id", std::string());
    // A process that died between the server's answer and sent.json's update re-sends the
    // start: find the run it created instead of creating a second one.
    RunInfo run = journal_id.empty() ? RunInfo{} : backend_.find_run_by_tag(exp, "trainer.journal_id", journal_id);
    if (run.run_id.empty()) {
      auto tags = key_values(rec.value("tags", json::array()));
      if (!journal_id.empty()) tags.push_back({"trainer.journal_id", journal_id});
      run = backend_.create_run(exp, rec.value("run_name", std::string()), rec.value("user", std::string()),
                                rec.value("start_time", now_ms()), tags);
    }
    progress_.experiment_id = run.experiment_id.empty() ? exp : run.experiment_id;
    progress_.run_id = run.run_id;
    progress_.artifact_uri = run.artifact_uri;
    confirmed_ = true;
    log_->info("mlflow: run {} in experiment {} at {}", run.run_id, progress_.experiment_id, backend_.uri());
  };
  if (op == "start") {
    if (progress_.run_id.empty()) create();
  } else if (op == "continue") {
    if (progress_.run_id.empty()) {
      fs::path prev = journal_dir(rec.value("previous_run_dir", std::string()));
      if (strict_) {
        // The previous run's journal would be sent and its sent.json would say which MLflow
        // run to write to: only a directory the user named may be used.
        const fs::path named = fs::weakly_canonical(prev.parent_path());
        const bool own = named == fs::weakly_canonical(fs::absolute(run_dir));
        if (!own && std::find(trusted_.begin(), trusted_.end(), named) == trusted_.end()) {
          throw JournalError(where + ": a continue record names the run directory " + named.string() +
                             ", which was not given on the command line; name it after the run directory if it is "
                             "the run this one resumed: trainer mlflow sync " +
                             run_dir.string() + " " + named.string());
        }
        prev = journal_dir(named.string());
        if (own) prev = dir_;
      }
      if (!strict_ && nested_ && !prev.empty() && prev != dir_) {
        // The plugin's sender follows one continue record, its own run's: the run directory the
        // user resumed from. That directory's own continue record (not sent yet) may name any
        // other (the directory may come from someone else); only the user can say that one is
        // the run before it.
        throw RefusedError(where + " continues the MLflow run of " + prev.parent_path().string() + ", a directory " +
                           resumed_by_.string() + " did not resume from; " + run_dir.string() +
                           "'s records go first and wait for it: after this run ends, send them in order with "
                           "trainer mlflow sync " +
                           resumed_by_.string() + " " + run_dir.string() + " " + prev.parent_path().string());
      }
      if (!prev.empty() && prev != dir_ && fs::exists(prev / kJournal)) {
        // What the interrupted run could not send goes first, in order, under its journal's
        // lock: a sync of that directory meanwhile would send them too, or into another run.
        std::unique_ptr<JournalLock> held;
        try {
          held = std::make_unique<JournalLock>(prev);
        } catch (const std::exception& e) {
          throw TransientError(std::string(e.what()) + "; its records go before this run's: tried again later");
        }
        Sender before(backend_, prev, log_);
        before.nested_ = true;
        before.resumed_by_ = run_dir;
        if (strict_) before.trust_only(trusted_);
        std::string err;
        if (!before.send_pending(&err)) {
          if (before.blocked()) throw RefusedError(err);
          throw TransientError(err);
        }
        if (before.sent_records() > 0) {
          log_->info("mlflow: sent {} records of {} left unsent by the run this one resumes", before.sent_records(),
                     prev.parent_path().string());
        }
      }
      const Progress p = read_progress(prev, backend_.uri());
      if (!p.run_id.empty()) {
        const RunInfo run = backend_.get_run(p.run_id);
        progress_.experiment_id = run.experiment_id;
        progress_.run_id = run.run_id;
        progress_.artifact_uri = run.artifact_uri;
        confirmed_ = true;
        log_->info("mlflow: continuing run {} at {}", run.run_id, backend_.uri());
      } else {
        log_->warn("mlflow: the resumed run's MLflow run is unknown at {}; starting a new one", backend_.uri());
        create();
      }
    }
    confirm_run();
    backend_.update_run(progress_.run_id, "RUNNING", 0);
  } else if (op == "batch") {
    need_run();
    std::vector<Metric> metrics;
    for (const auto& m : rec.value("metrics", json::array())) {
      metrics.push_back({m.at(0).get<std::string>(), metric_value_from(m.at(1)), m.at(2).get<std::int64_t>(),
                         m.at(3).get<std::int64_t>()});
    }
    backend_.log_batch(progress_.run_id, metrics, key_values(rec.value("params", json::array())),
                       key_values(rec.value("tags", json::array())));
  } else if (op == "artifact") {
    need_run();
    const fs::path file = artifact_source(run_dir, rec.at("file").get<std::string>(), where);
    if (!fs::exists(file)) throw RejectedError("artifact file " + file.string() + " no longer exists");
    if (!fs::is_regular_file(file)) throw RejectedError("artifact file " + file.string() + " is not a regular file");
    RunInfo run;
    run.run_id = progress_.run_id;
    run.experiment_id = progress_.experiment_id;
    run.artifact_uri = progress_.artifact_uri;
    backend_.log_artifact(run, file.string(), rec.at("path").get<std::string>());
  } else if (op == "end") {
    need_run();
    backend_.update_run(progress_.run_id, rec.at("status").get<std::string>(), rec.value("end_time", now_ms()));
  } else {
    throw RejectedError("unknown journal record '" + op + "'");
  }
}

}  // namespace trainer::mlflow
