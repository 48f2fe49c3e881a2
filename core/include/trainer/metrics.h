#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trainer/export.h"

namespace spdlog {
class logger;
}

namespace trainer {

/// One metric value: `name` at optimizer step `step`, wall-clock `time` (seconds since the
/// Unix epoch).
struct MetricPoint {
  std::int64_t step = 0;
  std::string name;
  double value = 0.0;
  double time = 0.0;
};

/// Receives metric points. Sinks never throw into training: MetricsLogger catches and logs.
/// Implementations need not be thread-safe: MetricsLogger serialises calls.
class TRAINER_API MetricSink {
 public:
  virtual ~MetricSink() = default;
  /// A group of points logged together (same step and time).
  virtual void write(const std::vector<MetricPoint>& points) = 0;
  /// Makes everything written so far durable.
  virtual void flush() {}
  /// The run ended with `status` ("FINISHED", "FAILED", "KILLED").
  virtual void close(const std::string& status) { (void)status; }
};

/// Appends one JSON object per point to a file: {"step":..,"name":..,"value":..,"time":..}.
class TRAINER_API JsonlSink final : public MetricSink {
 public:
  explicit JsonlSink(const std::string& path);
  ~JsonlSink() override;
  void write(const std::vector<MetricPoint>& points) override;
  void flush() override;
  void close(const std::string& status) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Logs each group as one info line: "step 120 | eval/loss 0.3121 | eval/accuracy 0.8875"
/// (a name that appears twice in the group, once, with its last value).
class TRAINER_API ConsoleSink final : public MetricSink {
 public:
  explicit ConsoleSink(std::shared_ptr<spdlog::logger> logger);
  void write(const std::vector<MetricPoint>& points) override;

 private:
  std::shared_ptr<spdlog::logger> logger_;
};

/// Fans metric points out to every sink. Thread-safe. A sink that throws is logged once and
/// disabled; training goes on.
///
/// Points of the same step are grouped: whoever logs them (the core, any plugin), sinks get
/// them in one write, so the console prints one line per step. A group goes to the sinks when
/// the core ends the step (commit()), when a point of another step is logged (which ends the
/// open group early: a plugin logging at another step gets a line of its own), and at
/// flush() and close().
class TRAINER_API MetricsLogger {
 public:
  explicit MetricsLogger(std::shared_ptr<spdlog::logger> logger = nullptr);
  void add_sink(std::shared_ptr<MetricSink> sink);
  /// Logs `values` at `step` with the current wall-clock time. A name logged twice at one
  /// step gives two points (the console shows the later value).
  void log(std::int64_t step, const std::map<std::string, double>& values);
  /// Writes the group of the current step to the sinks.
  void commit();
  void flush();
  void close(const std::string& status);
  /// The last value logged for each name.
  std::map<std::string, double> latest() const;

 private:
  std::shared_ptr<spdlog::logger> logger_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<MetricSink>> sinks_;
  std::vector<bool> disabled_;
  std::map<std::string, double> latest_;
  std::vector<MetricPoint> pending_;  ///< the current step's group, not written yet

  void commit_locked();
};

/// Seconds since the Unix epoch.
TRAINER_API double wall_time_s();

}  // namespace trainer
