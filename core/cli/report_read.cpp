// `trainer report`: reading a run directory. The directory is untrusted input (it may come from a
// colleague): every file is read up to its limit (report.h), lines are read without holding more
// than a line's limit, files that are not regular files are not opened, and what was left out is
// recorded for the page.
#include "report.h"
#include "report_files.h"
#include "report_memory.h"
#include "trainer/json.h"
#include "trainer/run_records.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

namespace trainer::report {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxListedLines = 10;   // malformed line numbers named on the page
constexpr std::size_t kLogProblemLines = 30;  // warning/error lines of trainer.log shown
constexpr std::size_t kLogTailLines = 40;     // last lines of trainer.log shown

}  // namespace

/// "1024 MiB", "256 KiB", "1.5 MiB", "12 bytes".
std::string size_text(std::uintmax_t bytes) {
  const bool mib = bytes >= (1u << 20), kib = bytes >= (1u << 10);
  const double v = mib ? double(bytes) / (1u << 20) : kib ? double(bytes) / (1u << 10) : double(bytes);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  std::string text = buf;
  if (text.size() > 2 && text.compare(text.size() - 2, 2, ".0") == 0) text.resize(text.size() - 2);
  return text + (mib ? " MiB" : kib ? " KiB" : " bytes");
}

bool regular_file(const fs::path& path, std::string& why, std::uintmax_t& size) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) return false;
  if (ec) {
    why = "cannot access " + path.string() + ": " + ec.message();
    return false;
  }
  if (!fs::is_regular_file(st)) {
    why = path.string() + " is not a regular file: not read";
    return false;
  }
  size = fs::file_size(path, ec);
  if (ec) size = 0;
  return true;
}

bool read_start(const fs::path& path, std::string& out, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.clear();
  std::vector<char> buf(kChunkBytes);
  while (out.size() < max_bytes && in) {
    in.read(buf.data(), std::streamsize(std::min(buf.size(), max_bytes - out.size())));
    out.append(buf.data(), std::size_t(in.gcount()));
  }
  return !in.bad();
}

namespace {

/// One metrics.jsonl line (trainer/run_records.h's codec); false when it is not a metric, or
/// its name is longer than a chart can show.
bool parse_metric_line(const std::string& line, std::string& name, Point& p) {
  auto m = decode_metric(line);
  if (!m || m->name.size() > kMaxMetricNameBytes) return false;
  name = std::move(m->name);
  p.step = double(m->step);
  p.value = m->value;
  p.time = m->time;
  return true;
}

void read_metrics(const fs::path& path, RunData& data) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ReportError("cannot read " + path.string() + ": " + errno_text());
  LineReader reader(in, kMaxMetricsBytes, kMaxMetricLineBytes);
  std::string line, name;
  std::size_t number = 0;
  while (reader.next(line)) {
    ++number;
    // The last line without a newline: one the writer had not finished, or where the limit cut the file.
    const bool complete = reader.complete();
    if (!complete && reader.budget_spent()) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    Point p;
    if (!reader.too_long() && parse_metric_line(line, name, p)) {
      data.metrics[name].push_back(p);
      ++data.lines_read;
    } else if (!complete) {
      data.truncated_last_line = true;
    } else {
      ++data.malformed_lines;
      data.long_lines += reader.too_long();
      if (data.malformed_line_numbers.size() < kMaxListedLines) data.malformed_line_numbers.push_back(number);
    }
  }
  if (reader.bad()) throw ReportError("error reading " + path.string() + ": " + errno_text());
  if (reader.budget_spent()) {
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    data.read_notes.push_back(path.string() + (ec ? "" : " is " + size_text(size)) + ": only its first " +
                              size_text(kMaxMetricsBytes) + " read, the rest left out.");
  }
}

void read_status(const fs::path& path, RunData& data) {
  std::uintmax_t size = 0;
  if (!regular_file(path, data.status_error, size)) return;
  if (size > kMaxStatusBytes) {
    data.status_error =
        path.string() + " is " + size_text(size) + ", more than the " + size_text(kMaxStatusBytes) + " read: not read";
    return;
  }
  std::string text;
  if (!read_start(path, text, kMaxStatusBytes + 1)) {
    data.status_error = "cannot read " + path.string() + ": " + errno_text();
    return;
  }
  if (text.size() > kMaxStatusBytes) {  // it grew since
    data.status_error = path.string() + " is more than the " + size_text(kMaxStatusBytes) + " read: not read";
    return;
  }
  try {
    data.status = decode_status(text);
  } catch (const std::exception& e) {
    data.status_error = path.string() + " " + e.what();
  }
}

bool is_warning(const std::string& level) { return level == "warning" || level == "warn"; }
bool is_error(const std::string& level) { return level == "error" || level == "critical" || level == "err"; }

void read_log(const fs::path& path, RunData& data) {
  std::uintmax_t size = 0;
  if (!regular_file(path, data.log_error, size)) return;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    data.log_error = "cannot read " + path.string() + ": " + errno_text();
    return;
  }
  // A larger log: its last kMaxLogBytes, from the first whole line in them (what the page shows is its end).
  bool skip_first = false;
  if (size > kMaxLogBytes) {
    in.seekg(std::streamoff(size - kMaxLogBytes - 1));
    skip_first = in.get() != '\n';
    data.read_notes.push_back(path.string() + " is " + size_text(size) + ": only its last " + size_text(kMaxLogBytes) +
                              " read (the warnings and errors counted are those in it).");
  }
  LineReader reader(in, kMaxLogBytes, kMaxLogLineChars);
  std::deque<std::string> tail, problems;
  std::string line;
  while (reader.next(line)) {
    if (skip_first) {
      skip_first = false;
      continue;
    }
    if (reader.too_long()) line += " …";
    // spdlog's "%Y-%m-%d %H:%M:%S.%e %-5l %v": the level is the third word.
    std::istringstream words(line);
    std::string date, time, level;
    words >> date >> time >> level;
    const bool warning = is_warning(level), error = is_error(level);
    data.log_warnings += warning;
    data.log_errors += error;
    if (warning || error) {
      problems.push_back(line);
      if (problems.size() > kLogProblemLines) problems.pop_front();
    }
    tail.push_back(line);
    if (tail.size() > kLogTailLines) tail.pop_front();
  }
  data.log_problems.assign(problems.begin(), problems.end());
  data.log_tail.assign(tail.begin(), tail.end());
}

void read_config(const fs::path& path, RunData& data) {
  std::uintmax_t size = 0;
  if (!regular_file(path, data.config_error, size)) return;
  std::string config;
  if (!read_start(path, config, kMaxConfigBytes + 1)) {
    data.config_error = "cannot read " + path.string() + ": " + errno_text();
    return;
  }
  if (config.size() > kMaxConfigBytes) {
    config.resize(kMaxConfigBytes);
    size = std::max<std::uintmax_t>(size, kMaxConfigBytes + 1);
    data.config_cut = true;
    data.read_notes.push_back(path.string() + " is " + size_text(size) + ": only its first " +
                              size_text(kMaxConfigBytes) + " shown, the rest left out.");
  }
  data.config_toml = std::move(config);
}

/// A JSON number, or NaN for null (a non-finite value written by lr-find); nullopt otherwise.
std::optional<double> number_or_nan(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end()) return std::nullopt;
  if (it->is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (it->is_number()) return it->get<double>();
  return std::nullopt;
}

void read_lr_find(const fs::path& path, RunData& data) {
  std::uintmax_t size = 0;
  if (!regular_file(path, data.lr_find_error, size)) return;  // absent: not an lr-find run
  if (size > kMaxLrFindBytes) {
    data.lr_find_error =
        path.string() + " is " + size_text(size) + ", more than the " + size_text(kMaxLrFindBytes) + " read: not read";
    return;
  }
  std::string text;
  if (!read_start(path, text, kMaxLrFindBytes + 1) || text.size() > kMaxLrFindBytes) {
    data.lr_find_error =
        "cannot read " + path.string() + (text.size() > kMaxLrFindBytes ? ": it grew" : ": " + errno_text());
    return;
  }
  if (json_nesting(text) > 8) {
    data.lr_find_error = path.string() + " nests deeper than an lr_find.json does: not read";
    return;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    data.lr_find_error = path.string() + " is not JSON: " + e.what();
    return;
  }
  if (!j.is_object() || !j.contains("points") || !j["points"].is_array()) {
    data.lr_find_error = path.string() + " has no \"points\" array: not an lr_find.json";
    return;
  }
  LrFindData f;
  for (const auto& p : j["points"]) {
    const auto lr = p.is_object() ? number_or_nan(p, "lr") : std::nullopt;
    const auto step = p.is_object() ? number_or_nan(p, "step") : std::nullopt;
    if (!lr || !step || !(std::isfinite(*lr) && *lr > 0)) {
      ++f.bad_points;
      continue;
    }
    const auto loss = number_or_nan(p, "loss"), smoothed = number_or_nan(p, "smoothed");
    f.points.push_back({*step, *lr, loss.value_or(std::numeric_limits<double>::quiet_NaN()),
                        smoothed.value_or(std::numeric_limits<double>::quiet_NaN())});
  }
  const auto suggested = number_or_nan(j, "suggested_lr");
  if (suggested && std::isfinite(*suggested) && *suggested > 0) f.suggested_lr = *suggested;
  const auto text_of = [&j](const char* key) {
    const auto it = j.find(key);
    std::string s = it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
    if (s.size() > 1000) s = s.substr(0, 1000) + " …";
    return s;
  };
  f.no_suggestion = text_of("no_suggestion");
  f.stopped = text_of("stopped");
  data.lr_find = std::move(f);
}

}  // namespace

RunData read_run(const std::string& dir) {
  std::error_code ec;
  const fs::path root(dir);
  if (!fs::exists(root, ec)) {
    throw ReportError(ec ? "cannot access run directory " + dir + ": " + ec.message()
                         : "run directory " + dir + " does not exist");
  }
  if (!fs::is_directory(root, ec)) throw ReportError(dir + " is not a directory (expected a run directory)");
  const fs::path metrics = root / "metrics.jsonl";
  if (!fs::exists(metrics, ec)) {
    throw ReportError(ec ? "cannot access " + metrics.string() + ": " + ec.message()
                         : metrics.string() + " does not exist: " + dir +
                               " is not a run directory, or its run logged no metrics (metrics.jsonl = false)");
  }
  if (!fs::is_regular_file(metrics, ec)) throw ReportError(metrics.string() + " is not a file");
  RunData data;
  data.dir = dir;
  fs::path canonical = fs::weakly_canonical(fs::absolute(root, ec), ec);
  if (canonical.empty()) canonical = root;
  if (!canonical.has_filename()) canonical = canonical.parent_path();
  data.name = canonical.filename().string();
  read_metrics(metrics, data);
  read_config(root / "config.toml", data);
  read_status(root / "status.json", data);
  read_log(root / "trainer.log", data);
  read_lr_find(root / "lr_find.json", data);
  read_memory_map(root, data);
  data.generated_at = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return data;
}

}  // namespace trainer::report
