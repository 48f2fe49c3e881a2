#include "trainer/metrics.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "trainer/durable_file.h"
#include "trainer/error.h"
#include "trainer/logging.h"
#include "trainer/run_records.h"

namespace trainer {

double wall_time_s() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

struct JsonlSink::Impl {
  std::string path;
  std::FILE* f = nullptr;
};

JsonlSink::JsonlSink(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  // Appended to, never through a link nor into a FIFO or device planted at the name.
  FileDescriptor fd = open_for_append(path);
  impl_->f = ::fdopen(fd.get(), "a");
  if (!impl_->f) throw Error("cannot open metrics file " + path + " for writing");
  fd.release();  // the FILE owns it
}

JsonlSink::~JsonlSink() {
  if (impl_->f) std::fclose(impl_->f);
}

void JsonlSink::write(const std::vector<MetricPoint>& points) {
  if (!impl_->f) return;
  for (const auto& p : points) {
    const std::string line = encode_metric({p.step, p.name, p.value, p.time});
    std::fwrite(line.data(), 1, line.size(), impl_->f);
  }
  // One flush per logged group (every log_every steps): a crash loses nothing logged.
  std::fflush(impl_->f);
}

void JsonlSink::flush() {
  if (impl_->f) std::fflush(impl_->f);
}

void JsonlSink::close(const std::string&) {
  if (impl_->f) {
    std::fclose(impl_->f);
    impl_->f = nullptr;
  }
}

ConsoleSink::ConsoleSink(std::shared_ptr<spdlog::logger> logger) : logger_(std::move(logger)) {}

void ConsoleSink::write(const std::vector<MetricPoint>& points) {
  if (points.empty()) return;
  std::string line = "step " + std::to_string(points.front().step);
  // A name logged twice at the step (at two events, by two evaluations) shows its last value.
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto later = std::find_if(points.begin() + static_cast<std::ptrdiff_t>(i) + 1, points.end(),
                                    [&](const MetricPoint& p) { return p.name == points[i].name; });
    if (later == points.end()) line += fmt::format(" | {} {:.4g}", points[i].name, points[i].value);
  }
  logger_->info("{}", line);
}

MetricsLogger::MetricsLogger(std::shared_ptr<spdlog::logger> logger)
    : logger_(logger ? std::move(logger) : default_logger()) {}

void MetricsLogger::add_sink(std::shared_ptr<MetricSink> sink) {
  std::lock_guard<std::mutex> lock(mu_);
  sinks_.push_back(std::move(sink));
  disabled_.push_back(false);
}

void MetricsLogger::log(std::int64_t step, const std::map<std::string, double>& values) {
  const double t = wall_time_s();
  std::lock_guard<std::mutex> lock(mu_);
  if (!pending_.empty() && pending_.front().step != step) commit_locked();
  for (const auto& kv : values) {
    latest_[kv.first] = kv.second;
    pending_.push_back({step, kv.first, kv.second, t});
  }
}

void MetricsLogger::commit() {
  std::lock_guard<std::mutex> lock(mu_);
  commit_locked();
}

void MetricsLogger::commit_locked() {
  if (pending_.empty()) return;
  std::vector<MetricPoint> points;
  points.swap(pending_);
  for (std::size_t i = 0; i < sinks_.size(); ++i) {
    if (disabled_[i]) continue;
    try {
      sinks_[i]->write(points);
    } catch (const std::exception& e) {
      disabled_[i] = true;
      logger_->error("metric sink #{} failed and is disabled: {}", i, e.what());
    } catch (...) {
      disabled_[i] = true;
      logger_->error("metric sink #{} failed and is disabled: an exception that is not a std::exception", i);
    }
  }
}

void MetricsLogger::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  commit_locked();
  for (std::size_t i = 0; i < sinks_.size(); ++i) {
    if (disabled_[i]) continue;
    try {
      sinks_[i]->flush();
    } catch (const std::exception& e) {
      logger_->error("metric sink #{} failed to flush: {}", i, e.what());
    }
  }
}

void MetricsLogger::close(const std::string& status) {
  std::lock_guard<std::mutex> lock(mu_);
  commit_locked();
  for (std::size_t i = 0; i < sinks_.size(); ++i) {
    try {
      sinks_[i]->flush();
      sinks_[i]->close(status);
    } catch (const std::exception& e) {
      logger_->error("metric sink #{} failed to close: {}", i, e.what());
    } catch (...) {
      logger_->error("metric sink #{} failed to close: an exception that is not a std::exception", i);
    }
  }
}

std::map<std::string, double> MetricsLogger::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

}  // namespace trainer
