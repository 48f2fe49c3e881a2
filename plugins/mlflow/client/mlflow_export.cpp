#include "mlflow_export.h"

#include "backends.h"
#include "journal_check.h"
#include "journal_io.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainer::mlflow {

fs::path journal_dir(const std::string& run_dir) { return fs::path(run_dir) / "mlflow"; }

namespace {

constexpr const char* kSent = "sent.json";
constexpr const char* kLock = "lock";

json metric_record_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

double metric_value_from(const json& v) {
  if (v.is_number()) return v.get<double>();
  const std::string s = v.is_string() ? v.get<std::string>() : std::string();
  if (s == "Infinity") return std::numeric_limits<double>::infinity();
  if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  return std::numeric_limits<double>::quiet_NaN();
}

std::vector<KeyValue> key_values(const json& a) {
  std::vector<KeyValue> out;
  if (!a.is_array()) return out;
  for (const auto& kv : a) out.push_back({kv.at(0).get<std::string>(), kv.at(1).get<std::string>()});
  return out;
}

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return json::object();
  json j = json::parse(in, nullptr, false);
  return j.is_object() ? j : json::object();
}

void write_json_atomically(const fs::path& p, const json& j) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    out.flush();
    if (!out) throw std::runtime_error("cannot write " + tmp.string());
  }
  fs::rename(tmp, p);
}

}  // namespace

namespace detail {

std::int64_t drop_incomplete_tail(const fs::path& journal) {
  std::error_code ec;
  const auto size = static_cast<std::int64_t>(fs::file_size(journal, ec));
  if (ec || size == 0) return 0;
  std::ifstream in(journal, std::ios::binary);
  std::int64_t keep = size;
  char c = 0;
  while (keep > 0) {
    in.seekg(keep - 1);
    in.get(c);
    if (c == '\n') break;
    --keep;
  }
  if (keep == size) return 0;
  in.close();
  fs::resize_file(journal, static_cast<std::uintmax_t>(keep));
  return size - keep;
}


}  // namespace detail

using detail::drop_incomplete_tail;
using detail::for_each_record;
using detail::kJournal;
using detail::kRejected;

std::string canonical_uri(const std::string& uri) {
  if (uri.rfind("file:", 0) != 0) return uri;
  std::string path = uri.substr(5);
  if (path.rfind("//", 0) == 0) path = path.substr(2);
  return "file://" + fs::absolute(path).lexically_normal().string();
}

// ---- lock --------------------------------------------------------------------------------

JournalLock::JournalLock(const fs::path& dir) {
  fs::create_directories(dir);
  const std::string path = (dir / kLock).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot open " + path);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {0};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("?");
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    throw std::runtime_error("the MLflow journal in " + dir.string() + " is being written by another process (pid " +
                             pid + ")");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t w = ::pwrite(fd_, pid.data(), pid.size(), 0);
  }
}

JournalLock::~JournalLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

bool JournalLock::is_free(const fs::path& dir) {
  const std::string path = (dir / kLock).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  const bool free = ::flock(fd, LOCK_SH | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

// ---- sender ------------------------------------------------------------------------------

Progress read_progress(const fs::path& dir, const std::string& uri) {
  const json all = read_json_file(dir / kSent);
  Progress p;
  const std::string key = canonical_uri(uri);
  if (!all.contains("destinations") || !all["destinations"].contains(key)) return p;
  const json& d = all["destinations"][key];
  p.seq = d.value("seq", std::int64_t{0});
  p.offset = d.value("offset", std::int64_t{0});
  p.experiment_id = d.value("experiment_id", std::string());
  p.run_id = d.value("run_id", std::string());
  p.artifact_uri = d.value("artifact_uri", std::string());
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

/// A record's `seq`, or `fallback` when it has none (or not an integer).
std::int64_t seq_of(const json& rec, std::int64_t fallback) {
  return rec.is_object() && rec.contains("seq") && rec["seq"].is_number_integer() ? rec["seq"].get<std::int64_t>()
                                                                                  : fallback;
}

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
      std::ofstream(dir_ / kRejected, std::ios::app) << line << "\n";
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
      std::ofstream(dir_ / kRejected, std::ios::app) << line << "\n";
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
    if (progress_.run_id.empty()) throw RejectedError("no MLflow run to log to (the journal's start record was refused)");
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
                             "the run this one resumed: trainer mlflow sync " + run_dir.string() + " " +
                             named.string());
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
                           "trainer mlflow sync " + resumed_by_.string() + " " + run_dir.string() + " " +
                           prev.parent_path().string());
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

// ---- exporter ----------------------------------------------------------------------------

Exporter::Exporter(std::unique_ptr<Backend> backend, const std::string& run_dir, ExportOptions options,
                   std::shared_ptr<spdlog::logger> log)
    : backend_(std::move(backend)),
      dir_(journal_dir(run_dir)),
      options_(std::move(options)),
      log_(log ? std::move(log) : spdlog::default_logger()) {
  lock_ = std::make_unique<JournalLock>(dir_);
  if (const std::int64_t cut = drop_incomplete_tail(dir_ / kJournal); cut > 0) {
    log_->warn("mlflow: {} ended in a record cut short ({} bytes, its writer died); dropped",
               (dir_ / kJournal).string(), cut);
  }
  // A run directory used again (--run-dir of an earlier run) goes on numbering its journal.
  for_each_record(dir_ / kJournal, 0, [&](const std::string& line, std::int64_t) {
    const json rec = json::parse(line, nullptr, false);
    next_seq_ = std::max(next_seq_, seq_of(rec, 0) + 1);
    return true;
  });
  journal_fd_ = ::open((dir_ / kJournal).c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (journal_fd_ < 0) {
    throw std::runtime_error("cannot open " + (dir_ / kJournal).string() + " for appending: " + std::strerror(errno));
  }
  sender_ = std::make_unique<Sender>(*backend_, dir_, log_);
  if (options_.background) thread_ = std::thread([this] { run(); });
}

Exporter::~Exporter() {
  if (thread_.joinable()) close(0.0);
  if (journal_fd_ >= 0) ::close(journal_fd_);
}

void Exporter::metrics(std::vector<Metric> points) {
  if (points.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!options_.background) {
    std::deque<Item> items;
    items.push_back({std::move(points), nullptr});
    journal(items);
    try_send();
    return;
  }
  queued_metrics_ += points.size();
  queue_.push_back({std::move(points), nullptr});
  if (queued_metrics_ >= kMaxMetricsPerBatch) cv_.notify_all();
}

void Exporter::record(json rec) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!options_.background) {
    std::deque<Item> items;
    items.push_back({{}, std::move(rec)});
    journal(items);
    try_send();
    return;
  }
  queue_.push_back({{}, std::move(rec)});
  cv_.notify_all();
}

std::int64_t Exporter::metrics_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sender_->sent_metrics();
}

void Exporter::append(json rec) {
  const fs::path path = dir_ / kJournal;
  const std::string seq = std::to_string(next_seq_);
  if (tail_dirty_) {
    // A failed write left part of a line that could not be cut then: cut it before appending,
    // or append nothing (a record appended to it would merge with it into one line).
    try {
      drop_incomplete_tail(path);
      tail_dirty_ = false;
    } catch (const std::exception&) {
    }
  }
  int err = 0;
  if (!tail_dirty_) {
    rec["seq"] = next_seq_;
    const std::string line = rec.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    const off_t before = ::lseek(journal_fd_, 0, SEEK_END);
    std::size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(journal_fd_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      done += static_cast<std::size_t>(n);
    }
    if (done == line.size()) {
      ++next_seq_;
      if (lost_records_ > 0) {
        log_->warn("mlflow: {} takes records again; {} records could not be written to it and are lost", path.string(),
                   lost_records_);
        lost_records_ = 0;
      }
      return;
    }
    // Part of the line may be on disk: cut back to the last complete line.
    if (done > 0 && (before < 0 || ::ftruncate(journal_fd_, before) != 0)) tail_dirty_ = true;
  } else {
    err = EIO;
  }
  if (lost_records_++ == 0) {
    log_->error("mlflow: cannot append record {} to {}: {} (errno {}); it is lost, neither journaled nor sent{}; "
                "free space there (or fix the file's permissions)",
                seq, path.string(), std::strerror(err), err,
                tail_dirty_ ? "; the partial line it left is cut before the next record is written" : "");
  }
}

void Exporter::journal(std::deque<Item>& items) {
  std::vector<Metric> pending;
  auto flush_metrics = [&] {
    for (std::size_t i = 0; i < pending.size(); i += kMaxMetricsPerBatch) {
      json ms = json::array();
      for (std::size_t j = i; j < std::min(pending.size(), i + kMaxMetricsPerBatch); ++j) {
        const Metric& m = pending[j];
        ms.push_back(json::array({m.key, metric_record_value(m.value), m.timestamp_ms, m.step}));
      }
      append({{"op", "batch"}, {"metrics", std::move(ms)}});
    }
    pending.clear();
  };
  for (auto& item : items) {
    if (item.rec.is_null()) {
      pending.insert(pending.end(), std::make_move_iterator(item.metrics.begin()),
                     std::make_move_iterator(item.metrics.end()));
    } else {
      flush_metrics();
      append(std::move(item.rec));
    }
  }
  flush_metrics();
  items.clear();
}

bool Exporter::try_send() {
  using Clock = std::chrono::steady_clock;
  if (outage_ && Clock::now() < retry_at_) return false;
  std::string err;
  bool sent = false;
  try {
    sent = sender_->send_pending(&err);
  } catch (const std::exception& e) {
    // Not the server: sent.json cannot be written (a full disk). Kept, tried again later; an
    // exception must not end the sender's thread (or the process with it).
    err = e.what();
  }
  if (sent) {
    if (outage_) log_->info("mlflow: {} answers again; the records kept meanwhile are sent", backend_->uri());
    outage_ = false;
    backoff_s_ = 0.0;
    return true;
  }
  if (options_.abort->load()) return false;
  if (!outage_ && sender_->blocked()) {
    // Refused for a cause waiting alone does not fix (a wrong URI, credentials, a deleted
    // experiment): said as such, with the way to deliver what is kept (unless the cause named it).
    const std::string fix = err.find("trainer mlflow sync") != std::string::npos
                                ? std::string()
                                : ": fix that, then `trainer mlflow sync " + dir_.parent_path().string() +
                                      "` sends each once";
    log_->error("mlflow: {}; records are kept in {}{} (this run keeps trying meanwhile)", err,
                (dir_ / kJournal).string(), fix);
  } else if (!outage_) {
    log_->warn("mlflow: cannot send to {} ({}); records are kept in {} and sent when it answers", backend_->uri(), err,
               (dir_ / kJournal).string());
  }
  outage_ = true;
  backoff_s_ = backoff_s_ <= 0 ? 0.5 : std::min(options_.max_backoff_s, backoff_s_ * 2);
  retry_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(backoff_s_));
  return false;
}

void Exporter::run() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    auto wait = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.flush_interval_s));
    if (outage_) wait = std::min(wait, std::max(Clock::duration::zero(), retry_at_ - Clock::now()));
    cv_.wait_for(lock, wait, [&] {
      return stop_ || (!queue_.empty() && (closing_ || queued_metrics_ >= kMaxMetricsPerBatch || !queue_.back().rec.is_null()));
    });
    if (stop_) break;
    std::deque<Item> items;
    items.swap(queue_);
    queued_metrics_ = 0;
    lock.unlock();
    // Journal writes and sends happen outside the lock: enqueueing never waits for them.
    journal(items);
    const bool caught_up = try_send();
    lock.lock();
    if (closing_ && queue_.empty() && caught_up) break;
  }
  thread_done_ = true;
  idle_cv_.notify_all();
}

std::int64_t Exporter::close(double timeout_s) {
  if (!options_.background) {
    std::lock_guard<std::mutex> lock(mu_);
    try_send();
    return sender_->pending().first;
  }
  if (thread_.joinable()) {
    std::unique_lock<std::mutex> lock(mu_);
    closing_ = true;
    cv_.notify_all();
    idle_cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_s)), [&] { return thread_done_; });
    stop_ = true;
    options_.abort->store(true);
    cv_.notify_all();
    lock.unlock();
    thread_.join();
  }
  // What the thread had no time to journal (it was waiting on the network) goes to the journal now.
  std::lock_guard<std::mutex> lock(mu_);
  journal(queue_);
  return sender_->pending().first;
}

}  // namespace trainer::mlflow
