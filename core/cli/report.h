#pragma once
// `trainer report RUN_DIR`: a run directory as one self-contained HTML page.
//
// 1. `read_run()` reads what the run directory holds: metrics.jsonl (skipping what it cannot
//    read, and saying so), config.toml, status.json and the warnings of trainer.log
//    (report_read.cpp). A run directory is untrusted input: every file is read up to a limit
//    below, and what was left out is said on the page.
// 2. `render_html()` draws it: a header with the run's status, the charts as inline SVG, the
//    config and the log's warnings. Nothing is loaded from anywhere: no scripts, fonts or images.
// 3. `write_report()` does both and writes the file; it is what the CLI calls.
//
// Only the standard library and nlohmann-json: the report reads a run without LibTorch.

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "trainer/run_records.h"

namespace trainer::report {

/// A value that is missing (a metric not logged at a step).
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// The text of errno, for messages about a file.
inline std::string errno_text() { return std::strerror(errno); }

// What the report reads of a run directory at most. A larger file is cut (or, for status.json,
// not read) and the page says so; a file that is not a regular file (a FIFO, a device) is not read.
inline constexpr std::size_t kMaxMetricsBytes = std::size_t(128) << 20;    ///< metrics.jsonl: its first 128 MiB
inline constexpr std::size_t kMaxMetricLineBytes = std::size_t(16) << 10;  ///< a longer line is skipped
inline constexpr std::size_t kMaxMetricNameBytes = 256;                    ///< a line naming a longer metric is skipped
inline constexpr std::size_t kMaxStatusBytes = std::size_t(256) << 10;     ///< a larger status.json is not read
inline constexpr std::size_t kMaxConfigBytes = std::size_t(1) << 20;       ///< config.toml: its first 1 MiB shown
inline constexpr std::size_t kMaxLogBytes = std::size_t(16) << 20;         ///< trainer.log: its last 16 MiB read
inline constexpr std::size_t kMaxLogLineChars = 2000;                      ///< a longer log line is cut
inline constexpr std::size_t kMaxLrFindBytes = std::size_t(16) << 20;      ///< a larger lr_find.json is not read
inline constexpr std::size_t kMaxTimelineBytes = std::size_t(64)
                                                 << 20;  ///< memory.jsonl, memory.1.jsonl: their first 64 MiB
inline constexpr std::size_t kMaxTimelineLineBytes = std::size_t(16) << 10;  ///< a longer line is skipped
inline constexpr std::size_t kMaxSnapshots = 20;  ///< memory/oom-*.json read: the last by name (the newest steps)
inline constexpr std::size_t kMaxSnapshotBytes = std::size_t(8) << 20;  ///< a larger snapshot is not read
inline constexpr std::size_t kSnapshotRows = 10;                        ///< largest allocations shown per snapshot

// What the page draws at most, however many points and names metrics.jsonl holds.
inline constexpr std::size_t kMaxLinePoints = 2000;  ///< points of one chart line (each bucket's min and max kept)
inline constexpr std::size_t kMaxOtherCharts = 48;   ///< charts of "other metrics" (the first by name)
inline constexpr std::size_t kMaxMarkers = 100;      ///< out-of-memory and micro-batch markers on the memory chart
inline constexpr int kMaxTicks = 20;                 ///< ticks of one axis

/// One line of metrics.jsonl. `value` may be NaN or ±infinity ("NaN", "Infinity", "-Infinity"
/// in the file); `time` is seconds since the Unix epoch, NaN when the line has none.
struct Point {
  double step = 0;
  double value = 0;
  double time = 0;
};

/// An out-of-memory error: a point of `oom/micro_batch_size`.
struct OomEvent {
  double step = 0;
  double time = 0;
  double micro_batch = 0;  ///< the micro-batch size of the attempt that failed
};

/// The memory categories of the core's accounting (trainer/memory.h's MemoryCategory, in its
/// order), as memory.jsonl and the snapshots name them.
inline constexpr std::size_t kMemoryCategoryCount = 8;
inline constexpr const char* kMemoryCategoryNames[kMemoryCategoryCount] = {
    "other", "parameters", "gradients", "optimizer_state", "activations", "batch", "evaluation", "dataset"};

/// Bytes by category (kMemoryCategoryNames' order).
using CategoryBytes = std::array<double, kMemoryCategoryCount>;

/// A `step` line of memory.jsonl: the split at the step's highest point.
struct MemoryStep {
  double step = 0;
  double micro_batch = 0;
  CategoryBytes peak{};
};

/// An `oom` line of memory.jsonl.
struct MemoryOom {
  double step = 0;
  std::string phase;
  double micro_batch = 0;
  double attempt = 0;  ///< 0-based
  double requested = 0;
  std::optional<CategoryBytes> live;  ///< what was live at the refusal, when recorded
};

/// An out-of-memory snapshot (RUN_DIR/memory/oom-*.json): where it happened, the split and its
/// largest allocations.
struct SnapshotSummary {
  std::string file;  ///< relative to the run directory
  double step = 0, micro_batch = 0, attempt = 0, requested = 0, limit = 0, allocated = 0;
  std::string phase, reason, largest_category;
  CategoryBytes categories{};
  struct Block {
    double size = 0;
    std::string category, phase;
    double serial = 0;
  };
  std::vector<Block> largest;  ///< the first kSnapshotRows of its "largest"
};

/// A change of `train/micro_batch_size` from one logged point to the next.
struct MicroBatchChange {
  double step = 0;
  double time = 0;
  double from = 0;
  double to = 0;
};

/// A `trainer lr-find` run's lr_find.json: the sweep's points (the readable ones) and its outcome.
struct LrFindData {
  struct Sample {
    double step = 0, lr = 0, loss = 0, smoothed = 0;  ///< loss, smoothed: NaN when null in the file
  };
  std::vector<Sample> points;
  std::optional<double> suggested_lr;
  std::string no_suggestion;   ///< why there is none
  std::string stopped;         ///< why the sweep ended before its last step
  std::size_t bad_points = 0;  ///< points left out: not an object, or no positive finite lr
};

/// Everything the page shows, as read from a run directory.
struct RunData {
  std::string dir;   ///< the run directory, as given
  std::string name;  ///< its last path component
  /// Every metric's points in file order (a name logged twice at one step keeps both).
  std::map<std::string, std::vector<Point>> metrics;
  std::size_t lines_read = 0;                       ///< metric lines read
  std::size_t malformed_lines = 0;                  ///< lines skipped because they could not be read
  std::vector<std::size_t> malformed_line_numbers;  ///< the first few of them, from 1
  std::size_t long_lines = 0;                       ///< of the malformed lines, those over kMaxMetricLineBytes
  bool truncated_last_line = false;                 ///< the last line had no newline and did not parse
  std::optional<std::string> config_toml;           ///< config.toml verbatim (its start when cut), when present
  bool config_cut = false;                          ///< config.toml is larger than kMaxConfigBytes
  std::string config_error;                         ///< why config.toml could not be read (it exists)
  /// status.json, written when a run starts and ends, when present and readable (absent after
  /// kill -9 before the first write).
  std::optional<RunStatusRecord> status;
  std::string status_error;               ///< why status.json could not be read (it exists)
  std::string log_error;                  ///< why trainer.log could not be read (it exists)
  std::vector<std::string> read_notes;    ///< what reading left out (a file cut at its limit), a sentence each
  std::vector<std::string> log_problems;  ///< the last warning/error lines of trainer.log
  std::size_t log_warnings = 0;           ///< warning lines in trainer.log
  std::size_t log_errors = 0;             ///< error and critical lines in trainer.log
  std::vector<std::string> log_tail;      ///< the last lines of trainer.log
  std::optional<LrFindData> lr_find;      ///< lr_find.json, when present and readable
  std::string lr_find_error;              ///< why lr_find.json could not be read (it exists)
  std::vector<MemoryStep> memory_steps;   ///< memory.1.jsonl then memory.jsonl, in file order
  std::vector<MemoryOom> memory_ooms;
  std::size_t memory_bad_lines = 0;         ///< lines of memory.jsonl that could not be read
  std::vector<SnapshotSummary> snapshots;   ///< by name (step, phase, attempt)
  std::vector<std::string> snapshot_notes;  ///< snapshots not read, and why
  double generated_at = 0;                  ///< when it was read, seconds since the Unix epoch
};

/// A run directory or metrics file that cannot be read; the message names the path.
class ReportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads RUN_DIR. Throws ReportError when the directory or its metrics.jsonl is missing or
/// unreadable; anything else that is missing or broken is recorded in the result for the page.
RunData read_run(const std::string& dir);

/// Out-of-memory events and micro-batch changes, in file order, from `data.metrics`.
std::vector<OomEvent> oom_events(const RunData& data);
std::vector<MicroBatchChange> micro_batch_changes(const RunData& data);

/// The page: one self-contained HTML document (inline CSS and SVG, no script, no URL).
std::string render_html(const RunData& data);

/// Round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart), at most `max_ticks`
/// of them (clamped to 2..kMaxTicks); the first is <= lo and the last >= hi. With `integer`, at least
/// 1 apart. Always at least two finite, increasing values: lo == hi gives a range around the value;
/// a range that round ticks cannot cover in doubles (wider than the largest double, or only a few
/// doubles wide, as 1e17 to the next double) gives its two ends; NaN or infinity gives {0, 1}.
std::vector<double> nice_ticks(double lo, double hi, int max_ticks, bool integer = false);

/// `text` with & < > " ' replaced by entities.
std::string html_escape(const std::string& text);

/// Writes the page `page` returns ({where, HTML}) there, beside and renamed over (a browser
/// reloading it never sees half a page). Returns write_report's exit codes: 2 when a run
/// directory cannot be read (ReportError) or the file cannot be written, 1 on another error,
/// with the message on `err`. Never throws.
int write_page(const std::function<std::pair<std::string, std::string>()>& page, std::ostream& err,
               std::string* written_path = nullptr);

/// Writes RUN_DIR's report to `out_path` (empty: RUN_DIR/report.html). Returns an exit code:
/// 0 written, 2 when the run directory or its metrics.jsonl is missing/unreadable or out_path cannot be written
/// (message to `err` naming the path and what is wrong), 1 on an unexpected internal error. Never throws.
int write_report(const std::string& run_dir, const std::string& out_path, std::ostream& err,
                 std::string* written_path = nullptr);

/// The leaf keys of a config.toml ("training.batch_size") with their values as written
/// (`32`, `"adamw"`, `[1, 2]`), read line by line: what the comparison sets side by side.
std::map<std::string, std::string> config_leaves(const std::string& toml);

/// Several runs on one page: a line per run in each chart (x in steps), the legend by run
/// name, and the config keys whose values differ.
std::string render_comparison(const std::vector<RunData>& runs);

/// Writes the comparison of `run_dirs` (two or more) to `out_path` (empty: compare.html beside
/// the first run directory); exit codes as write_report's. Never throws.
int write_comparison(const std::vector<std::string>& run_dirs, const std::string& out_path, std::ostream& err,
                     std::string* written_path = nullptr);

}  // namespace trainer::report
