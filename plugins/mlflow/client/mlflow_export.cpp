#include "mlflow_export.h"

#include "backends.h"
#include "journal_check.h"
#include "journal_io.h"
#include "trainer/durable_file.h"
#include "trainer/json.h"
#include "trainer/secrets.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainer::mlflow {

fs::path journal_dir(const std::string& run_dir) { return fs::path(run_dir) / "mlflow"; }

namespace {

constexpr const char* kLock = "lock";

json metric_record_value(double v) {
  if (const char* name = json_nonfinite_name(v)) return name;
  return v;
}

}  // namespace

namespace detail {

std::int64_t drop_incomplete_tail(const fs::path& journal) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(journal, ec))) return 0;
  // Cut through a descriptor of the journal itself: a link or a FIFO planted at its name is
  // refused, never the file it leads to cut.
  const FileDescriptor fd = open_for_update(journal.string());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || st.st_size == 0) return 0;
  const std::int64_t size = st.st_size;
  std::int64_t keep = size;
  char buf[4096];
  while (keep > 0) {
    const std::int64_t from = std::max<std::int64_t>(0, keep - static_cast<std::int64_t>(sizeof buf));
    const ssize_t got = ::pread(fd.get(), buf, static_cast<std::size_t>(keep - from), from);
    if (got != keep - from) throw std::runtime_error("cannot read " + journal.string() + ": " + std::strerror(errno));
    const char* nl = static_cast<const char*>(::memrchr(buf, '\n', static_cast<std::size_t>(got)));
    if (nl) {
      keep = from + (nl - buf) + 1;
      break;
    }
    keep = from;
  }
  if (keep == size) return 0;
  if (::ftruncate(fd.get(), keep) != 0) {
    throw std::runtime_error("cannot cut " + journal.string() +
                             " back to its last whole record: " + std::strerror(errno));
  }
  return size - keep;
}

}  // namespace detail

using detail::drop_incomplete_tail;
using detail::for_each_record;
using detail::kJournal;
using detail::kRejected;
using detail::seq_of;

std::string canonical_uri(const std::string& uri) {
  if (uri.rfind("file:", 0) != 0) return trainer::without_userinfo(uri);
  std::string path = uri.substr(5);
  if (path.rfind("//", 0) == 0) path = path.substr(2);
  return "file://" + fs::absolute(path).lexically_normal().string();
}

// ---- lock --------------------------------------------------------------------------------

JournalLock::JournalLock(const fs::path& dir) {
  // mlflow/ and its lock are the run directory's own: a link at either is refused (exit 2).
  if (dir.has_parent_path()) fs::create_directories(dir.parent_path());
  make_run_subdir(dir.string());
  const std::string path = (dir / kLock).string();
  fd_ = open_for_update(path).release();
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
  journal_fd_ = open_for_append((dir_ / kJournal).string());  // closed by its holder if what follows throws
  sender_ = std::make_unique<Sender>(*backend_, dir_, log_);
  if (options_.background) thread_ = std::thread([this] { run(); });
}

Exporter::~Exporter() {
  if (thread_.joinable()) close(0.0);
  journal_fd_.reset();
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
    const off_t before = ::lseek(journal_fd_.get(), 0, SEEK_END);
    std::size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(journal_fd_.get(), line.data() + done, line.size() - done);
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
    if (done > 0 && (before < 0 || ::ftruncate(journal_fd_.get(), before) != 0)) tail_dirty_ = true;
  } else {
    err = EIO;
  }
  if (lost_records_++ == 0) {
    log_->error(
        "mlflow: cannot append record {} to {}: {} (errno {}); it is lost, neither journaled nor sent{}; "
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
    const std::string fix =
        err.find("trainer mlflow sync") != std::string::npos
            ? std::string()
            : ": fix that, then `trainer mlflow sync " + dir_.parent_path().string() + "` sends each once";
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
      return stop_ ||
             (!queue_.empty() && (closing_ || queued_metrics_ >= kMaxMetricsPerBatch || !queue_.back().rec.is_null()));
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
