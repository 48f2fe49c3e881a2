#include "report.h"

#include "report_chart.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

namespace trainer::report {
namespace {

namespace fs = std::filesystem;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::size_t kMaxEventRows = 200;   // rows of the out-of-memory/micro-batch table
constexpr std::size_t kMaxListedNames = 10;  // metric names listed in one note

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd",
                                    "#8c564b", "#e377c2", "#17becf", "#7f7f7f"};
constexpr const char* kOomColour = "#d62728";
constexpr const char* kMicroBatchColour = "#b8860b";

std::string iso_utc(double t) {
  if (!std::isfinite(t) || std::abs(t) > 1e11) return "unknown";  // beyond year 5000: not a time
  const std::time_t s = static_cast<std::time_t>(std::floor(t));
  std::tm tm{};
  if (!gmtime_r(&s, &tm)) return "unknown";
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string duration_text(double s) {
  if (!std::isfinite(s) || s < 0 || s > 1e11) return "unknown";
  char buf[64];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%d min %02d s", int(s / 60), int(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%d h %02d min", int(s / 3600), int(s / 60) % 60);
  }
  return buf;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<OomEvent> oom_events(const RunData& data) {
  std::vector<OomEvent> events;
  const auto it = data.metrics.find("oom/micro_batch_size");
  if (it == data.metrics.end()) return events;
  for (const auto& p : it->second) events.push_back({p.step, p.time, p.value});
  return events;
}

std::vector<MicroBatchChange> micro_batch_changes(const RunData& data) {
  std::vector<MicroBatchChange> changes;
  const auto it = data.metrics.find("train/micro_batch_size");
  if (it == data.metrics.end()) return changes;
  double previous = kNaN;
  for (const auto& p : it->second) {
    if (!std::isfinite(p.value)) continue;
    if (std::isfinite(previous) && p.value != previous) changes.push_back({p.step, p.time, previous, p.value});
    previous = p.value;
  }
  return changes;
}

namespace {

Line step_line(const RunData& data, const std::string& name, const std::string& colour) {
  Line l{name, colour, {}, false};
  const auto it = data.metrics.find(name);
  if (it != data.metrics.end()) {
    for (const auto& p : it->second) l.points.push_back({p.step, p.value, p.step});
  }
  return l;
}

bool logged(const RunData& data, const std::string& name) { return data.metrics.count(name) != 0; }

std::string figure(const Chart& c, const std::string& extra_class = "") {
  return "<figure class=\"card chart" + extra_class + "\"><h3>" + html_escape(c.title) + "</h3>\n" + render_svg(c) +
         "</figure>\n";
}

// ---- The page ------------------------------------------------------------------------------

struct StepChart {
  const char* title;
  const char* y_label;
  std::vector<std::string> names;
};

const std::vector<StepChart>& step_charts() {
  static const std::vector<StepChart> charts = {
      {"Loss", "loss", {"train/loss", "eval/loss"}},
      {"Accuracy", "accuracy", {"train/accuracy", "eval/accuracy"}},
      {"Learning rate", "learning rate", {"train/lr"}},
      {"Throughput", "samples/s", {"train/samples_per_s"}},
  };
  return charts;
}

const std::vector<std::string> kMemoryNames = {"memory/allocated_mb", "memory/reserved_mb", "memory/peak_mb"};
const std::vector<std::string> kEventNames = {"oom/micro_batch_size", "train/micro_batch_size"};

const char* const kStyle = R"(
*{box-sizing:border-box}
body{margin:0;background:#eef0f3;color:#1f2937;
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif}
main{max-width:1280px;margin:0 auto;padding:18px}
.card{background:#fff;border:1px solid #d8dce3;border-radius:8px;padding:14px 16px;margin:0 0 16px}
h1{font-size:22px;margin:0 0 2px}
h2{font-size:17px;margin:22px 0 10px}
.card h2{margin-top:0}
h3{font-size:14px;margin:0 0 6px}
.path{color:#6b7280;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px;word-break:break-all}
.badge{display:inline-block;vertical-align:middle;margin-left:8px;padding:2px 10px;border-radius:999px;
  font-size:13px;font-weight:700;color:#fff}
.s-finished{background:#15803d}.s-failed{background:#b91c1c}.s-killed{background:#c2410c}
.s-running{background:#2563eb}.s-unknown{background:#6b7280}
dl.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(230px,1fr));gap:10px 24px;margin:14px 0 0}
dl.facts dt{color:#6b7280;font-size:12px}
dl.facts dd{margin:0;font-weight:600;word-break:break-word}
.message{margin:12px 0 0;padding:8px 10px;border-left:4px solid #b91c1c;background:#fef2f2;
  white-space:pre-wrap;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px}
.notes{background:#fffbeb;border-color:#f2d58a}
.notes ul{margin:0;padding-left:20px}
.grid2{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:16px}
.grid3{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:14px}
.grid2,.grid3{margin-bottom:16px}
.grid2 .card,.grid3 .card{margin:0}
figure{margin:0}
svg{display:block;width:100%;height:auto;font-size:12px}
svg .plot{fill:#fbfcfd;stroke:none}
svg .grid{stroke:#e3e6eb;stroke-width:1}
svg .axis{fill:none;stroke:#6b7280;stroke-width:1}
svg .tick{fill:#4b5563;font-size:11px}
svg .label{fill:#374151;font-size:12px}
svg .legend{fill:#1f2937;font-size:12px}
svg .mlabel{font-size:11px;font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:3px}
svg .nonfinite{stroke:#d62728;stroke-width:2;fill:none}
table{border-collapse:collapse;font-size:13px;margin-top:10px}
td,th{border-bottom:1px solid #e5e7eb;padding:3px 12px 3px 0;text-align:left}
pre{margin:0;background:#f8f9fb;border:1px solid #e5e7eb;border-radius:6px;padding:10px;overflow:auto;
  max-height:520px;font:12px/1.45 ui-monospace,"DejaVu Sans Mono",monospace;white-space:pre}
details{margin-top:10px}
summary{cursor:pointer;color:#374151}
footer{color:#6b7280;font-size:12px;text-align:center;padding:4px 0 12px}
)";

std::string fact(const std::string& term, const std::string& value_html) {
  return "<div><dt>" + html_escape(term) + "</dt><dd>" + value_html + "</dd></div>\n";
}

/// The last point of `name`, "value (step N)", or empty when it was not logged.
std::string last_value(const RunData& data, const std::string& name) {
  const auto it = data.metrics.find(name);
  if (it == data.metrics.end() || it->second.empty()) return "";
  const auto& p = it->second.back();
  return format_number(p.value, 4) + " (step " + format_number(p.step, 12) + ")";
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

void render_header(const RunData& d, double t_first, double t_last, std::ostringstream& h) {
  std::string status, badge;
  if (d.status) {
    status = run_status_name(d.status->status);
    std::string lower = status;
    for (auto& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    badge = lower == "finished" || lower == "failed" || lower == "killed" ? "s-" + lower : "s-unknown";
  } else if (!d.status_error.empty()) {
    status = "UNKNOWN (status.json could not be read)";
    badge = "s-unknown";
  } else {
    status = "RUNNING (or ended without closing: no status.json)";
    badge = "s-running";
  }
  h << "<header class=\"card\"><h1>" << html_escape(d.name) << "<span class=\"badge " << badge << "\">"
    << html_escape(status.substr(0, status.find(' '))) << "</span></h1>\n"
    << "<div class=\"path\">" << html_escape(d.dir) << "</div>\n<dl class=\"facts\">\n";
  h << fact("Status", html_escape(status));
  if (d.status) h << fact("Exit code", std::to_string(d.status->exit_code));
  if (d.status && d.status->status == RunStatus::Failed && d.status->failure != FailureKind::None) {
    h << fact("Failure", html_escape(std::string(failure_kind_name(d.status->failure)) +
                                     (d.status->oom_phase ? std::string(" in ") + oom_phase_name(*d.status->oom_phase)
                                                          : std::string())));
  }

  double last_step = -std::numeric_limits<double>::infinity();
  for (const auto& [name, points] : d.metrics) {
    for (const auto& p : points) last_step = std::max(last_step, p.step);
  }
  if (d.status) {
    h << fact("Steps", std::to_string(d.status->global_step));
  } else if (std::isfinite(last_step)) {
    h << fact("Steps", html_escape(format_number(last_step, 12)) + " (last logged)");
  }
  const auto epoch = d.metrics.find("train/epoch");
  if (epoch != d.metrics.end() && !epoch->second.empty()) {
    h << fact("Epochs", html_escape(format_number(epoch->second.back().value, 4)) + " (last train/epoch)");
  } else if (d.status) {
    h << fact("Epoch", std::to_string(d.status->epoch) + " (status.json, from 0)");
  }
  h << fact("Started (UTC)", html_escape(iso_utc(t_first)));
  h << fact("Duration", html_escape(duration_text(t_last - t_first)) + " (first to last metric)");
  if (!d.status && std::isfinite(t_last)) {
    h << fact("Last metric",
              html_escape(iso_utc(t_last) + ", " + duration_text(d.generated_at - t_last) + " before this report"));
  }
  for (const char* name : {"eval/accuracy", "eval/loss"}) {
    const std::string v = last_value(d, name);
    if (!v.empty()) h << fact(std::string("Last ") + name, html_escape(v));
  }
  if (d.status && !d.status->last_checkpoint.empty()) {
    h << fact("Last checkpoint", "<span class=\"path\">" + html_escape(d.status->last_checkpoint) + "</span>");
  }
  h << "</dl>\n";
  if (d.status && !d.status->message.empty()) {
    h << "<div class=\"message\">" << html_escape(d.status->message) << "</div>\n";
  }
  h << "</header>\n";
}

std::string events_table(const std::vector<OomEvent>& ooms, const std::vector<MicroBatchChange>& changes, double t0) {
  struct Row {
    double time, step;
    std::string what;
  };
  std::vector<Row> rows;
  for (const auto& e : ooms) {
    rows.push_back({e.time, e.step, "out of memory at micro-batch " + format_number(e.micro_batch)});
  }
  for (const auto& c : changes) {
    rows.push_back({c.time, c.step, "micro-batch " + format_number(c.from) + " → " + format_number(c.to)});
  }
  // By step; at one step the error comes before the change it caused.
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.step < b.step; });
  std::ostringstream t;
  t << "<table><tr><th>step</th><th>seconds since start</th><th>event</th></tr>\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (i == kMaxEventRows) {
      t << "<tr><td colspan=\"3\">… and " << rows.size() - i << " more</td></tr>\n";
      break;
    }
    t << "<tr><td>" << format_number(r.step, 12) << "</td><td>"
      << (std::isfinite(r.time) ? format_number(r.time - t0, 5) : "?") << "</td><td>" << html_escape(r.what)
      << "</td></tr>\n";
  }
  t << "</table>\n";
  return t.str();
}

}  // namespace

std::string render_html(const RunData& d) {
  double t_first = std::numeric_limits<double>::infinity(), t_last = -t_first;
  std::map<std::string, std::size_t> nonfinite;
  for (const auto& [name, points] : d.metrics) {
    for (const auto& p : points) {
      if (std::isfinite(p.time)) t_first = std::min(t_first, p.time), t_last = std::max(t_last, p.time);
      if (!std::isfinite(p.value)) ++nonfinite[name];
    }
  }
  if (!std::isfinite(t_first)) t_first = t_last = kNaN;

  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    << "<title>Run report: " << html_escape(d.name) << "</title>\n<style>" << kStyle
    << "</style>\n</head>\n<body>\n<main>\n";
  render_header(d, t_first, t_last, h);

  // Notes: what the page could not show, and why.
  std::vector<std::string> notes;
  if (d.metrics.empty()) notes.push_back("metrics.jsonl holds no metrics yet.");
  if (d.malformed_lines) {
    std::vector<std::string> numbers;
    for (const auto n : d.malformed_line_numbers) numbers.push_back(std::to_string(n));
    std::string long_lines;
    if (d.long_lines) {
      const std::string limit = std::to_string(kMaxMetricLineBytes >> 10) + " KiB";
      long_lines = d.long_lines == d.malformed_lines
                       ? (d.long_lines == 1 ? "; longer than " : "; all longer than ") + limit
                       : "; " + std::to_string(d.long_lines) + " of them longer than " + limit;
    }
    notes.push_back(std::to_string(d.malformed_lines) + " malformed line" + (d.malformed_lines > 1 ? "s" : "") +
                    " of metrics.jsonl skipped (line" + (numbers.size() > 1 ? "s " : " ") + join(numbers, ", ") +
                    (d.malformed_lines > numbers.size() ? ", …" : "") + long_lines + ").");
  }
  if (d.truncated_last_line) {
    notes.push_back(
        "The last line of metrics.jsonl is incomplete (the run is still writing it, or was killed "
        "mid-line): ignored.");
  }
  if (!nonfinite.empty()) {
    std::vector<std::string> parts;
    std::size_t total = 0;
    for (const auto& [name, n] : nonfinite) {
      if (parts.size() < kMaxListedNames) parts.push_back(name + " (" + std::to_string(n) + ")");
      total += n;
    }
    notes.push_back(std::to_string(total) + " NaN/infinite value" + (total > 1 ? "s" : "") +
                    " not drawn (marked × on the x axis): " + join(parts, ", ") +
                    (nonfinite.size() > parts.size() ? ", …" : "") + ".");
  }
  notes.insert(notes.end(), d.read_notes.begin(), d.read_notes.end());
  if (!d.status_error.empty()) notes.push_back("status.json could not be read: " + d.status_error + ".");
  for (const auto& chart : step_charts()) {
    std::vector<std::string> missing;
    for (const auto& n : chart.names) {
      if (!logged(d, n)) missing.push_back(n);
    }
    if (missing.size() == chart.names.size()) {
      notes.push_back(std::string(chart.title) + " chart left out: " + join(missing, " and ") + " not logged.");
    } else if (!missing.empty()) {
      notes.push_back(std::string(chart.title) + ": " + join(missing, " and ") + " not logged.");
    }
  }
  std::vector<std::string> missing_memory;
  for (const auto& n : kMemoryNames) {
    if (!logged(d, n)) missing_memory.push_back(n);
  }
  const auto ooms = oom_events(d);
  const auto changes = micro_batch_changes(d);
  const bool memory_chart = missing_memory.size() < kMemoryNames.size() || !ooms.empty();
  if (!memory_chart) {
    notes.push_back("Memory chart left out: " + join(missing_memory, ", ") +
                    " not logged (the memory_log plugin logs them).");
  } else if (!missing_memory.empty()) {
    notes.push_back("Memory: " + join(missing_memory, ", ") + " not logged.");
  }
  std::size_t events = 0;  // drawn as markers: those with a time
  for (const auto& e : ooms) events += std::isfinite(e.time);
  for (const auto& c : changes) events += std::isfinite(c.time);
  if (memory_chart && events > kMaxMarkers) {
    notes.push_back(std::to_string(events) + " out-of-memory errors and micro-batch changes: the first " +
                    std::to_string(kMaxMarkers) + " marked on the memory chart, the first " +
                    std::to_string(kMaxEventRows) + " in its table.");
  }
  std::set<std::string> known(kMemoryNames.begin(), kMemoryNames.end());
  known.insert(kEventNames.begin(), kEventNames.end());
  for (const auto& spec : step_charts()) known.insert(spec.names.begin(), spec.names.end());
  std::vector<std::string> other_names;
  for (const auto& [name, points] : d.metrics) {
    if (!known.count(name)) other_names.push_back(name);
  }
  if (other_names.size() > kMaxOtherCharts) {
    notes.push_back(std::to_string(other_names.size()) + " other metrics: the first " +
                    std::to_string(kMaxOtherCharts) + " drawn (by name), the rest left out.");
    other_names.resize(kMaxOtherCharts);
  }
  if (!notes.empty()) {
    h << "<section class=\"card notes\"><h2>Notes</h2><ul>\n";
    for (const auto& n : notes) h << "<li>" << html_escape(n) << "</li>\n";
    h << "</ul></section>\n";
  }

  std::vector<std::string> training;
  for (const auto& spec : step_charts()) {
    Chart c{spec.title, "step", spec.y_label, true, 600, 300, {}, {}};
    for (std::size_t i = 0; i < spec.names.size(); ++i) {
      if (logged(d, spec.names[i])) c.lines.push_back(step_line(d, spec.names[i], kPalette[i]));
    }
    if (!c.lines.empty()) training.push_back(figure(c));
  }
  if (!training.empty())
    h << "<section><h2>Training</h2><div class=\"grid2\">\n" << join(training, "") << "</div></section>\n";

  if (memory_chart) {
    const double t0 = std::isfinite(t_first) ? t_first : 0;
    double span = 0;
    for (const auto& n : kMemoryNames) {
      const auto it = d.metrics.find(n);
      if (it == d.metrics.end()) continue;
      for (const auto& p : it->second) {
        if (std::isfinite(p.time)) span = std::max(span, p.time - t0);
      }
    }
    const double unit = span > 3 * 3600 ? 3600 : span > 600 ? 60 : 1;
    const std::string unit_name = unit == 3600 ? "hours" : unit == 60 ? "minutes" : "seconds";
    Chart c{"Memory", unit_name + " since the first metric", "MB", false, 1200, 360, {}, {}};
    const char* const colours[] = {"#1f77b4", "#2ca02c", "#9467bd"};
    for (std::size_t i = 0; i < kMemoryNames.size(); ++i) {
      const auto it = d.metrics.find(kMemoryNames[i]);
      if (it == d.metrics.end()) continue;
      Line l{kMemoryNames[i], colours[i], {}, kMemoryNames[i] == "memory/reserved_mb"};
      for (const auto& p : it->second) l.points.push_back({(p.time - t0) / unit, p.value, p.step});
      c.lines.push_back(std::move(l));
    }
    for (const auto& e : ooms) {
      if (!std::isfinite(e.time)) continue;
      const std::string label = "OOM (micro-batch " + format_number(e.micro_batch) + ")";
      c.markers.push_back({(e.time - t0) / unit, label, label + " at step " + format_number(e.step, 12), kOomColour,
                           "out-of-memory error"});
    }
    for (const auto& ch : changes) {
      if (!std::isfinite(ch.time)) continue;
      const std::string label = "micro-batch " + format_number(ch.from) + " → " + format_number(ch.to);
      c.markers.push_back({(ch.time - t0) / unit, label, label + " at step " + format_number(ch.step, 12),
                           kMicroBatchColour, "micro-batch change"});
    }
    std::stable_sort(c.markers.begin(), c.markers.end(), [](const Marker& a, const Marker& b) { return a.x < b.x; });
    if (c.markers.size() > kMaxMarkers) c.markers.resize(kMaxMarkers);
    h << "<section><h2>Memory</h2>\n" << figure(c);
    if (!ooms.empty() || !changes.empty()) {
      h << "<div class=\"card\"><h3>Out-of-memory errors and micro-batch changes</h3>\n"
        << events_table(ooms, changes, t0) << "</div>\n";
    }
    h << "</section>\n";
  }

  std::vector<std::string> others;
  std::size_t colour = 0;
  for (const auto& name : other_names) {
    Chart c{name, "step", "", true, 420, 230, {step_line(d, name, kPalette[colour++ % std::size(kPalette)])}, {}};
    others.push_back(figure(c, " small"));
  }
  if (!others.empty())
    h << "<section><h2>Other metrics</h2><div class=\"grid3\">\n" << join(others, "") << "</div></section>\n";

  h << "<section class=\"card\"><h2>Log: warnings and errors</h2>\n";
  if (!d.log_error.empty()) {
    h << "<p>trainer.log could not be read: " << html_escape(d.log_error) << ".</p>\n";
  } else if (d.log_tail.empty()) {
    h << "<p>No trainer.log in the run directory (or it is empty).</p>\n";
  } else {
    h << "<p>trainer.log: " << d.log_warnings << " warning" << (d.log_warnings == 1 ? "" : "s") << ", " << d.log_errors
      << " error" << (d.log_errors == 1 ? "" : "s")
      << (d.log_problems.size() < d.log_warnings + d.log_errors
              ? " (the last " + std::to_string(d.log_problems.size()) + " shown)"
              : "")
      << ".</p>\n";
    if (!d.log_problems.empty()) h << "<pre>" << html_escape(join(d.log_problems, "\n")) << "</pre>\n";
    h << "<details><summary>The last " << d.log_tail.size() << " lines of trainer.log</summary><pre>"
      << html_escape(join(d.log_tail, "\n")) << "</pre></details>\n";
  }
  h << "</section>\n<section class=\"card\"><h2>Config</h2>\n";
  if (d.config_toml) {
    h << "<p class=\"path\">config.toml (the resolved config)"
      << (d.config_cut ? ": its first " + std::to_string(kMaxConfigBytes >> 20) + " MiB, the rest left out" : "")
      << "</p><pre>" << html_escape(*d.config_toml) << "</pre>\n";
  } else if (!d.config_error.empty()) {
    h << "<p>config.toml could not be read: " << html_escape(d.config_error) << ".</p>\n";
  } else {
    h << "<p>No config.toml in the run directory.</p>\n";
  }
  h << "</section>\n<footer>trainer report · " << d.lines_read << " metric values of " << d.metrics.size()
    << " names · generated " << iso_utc(d.generated_at) << "</footer>\n</main>\n</body>\n</html>\n";
  return h.str();
}

int write_report(const std::string& run_dir, const std::string& out_path, std::ostream& err,
                 std::string* written_path) {
  try {
    const RunData data = read_run(run_dir);
    const std::string html = render_html(data);
    const std::string out = out_path.empty() ? (fs::path(run_dir) / "report.html").string() : out_path;
    std::error_code ec;
    if (fs::is_directory(out, ec)) {
      err << "trainer report: cannot write " << out << ": it is a directory\n";
      return 2;
    }
    // Written beside and renamed over: a browser reloading the page never sees half a report.
    const std::string tmp = out + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (!f) {
        err << "trainer report: cannot write " << out << ": " << errno_text() << "\n";
        return 2;
      }
      f << html;
      f.close();
      if (!f) {
        err << "trainer report: cannot write " << out << ": " << errno_text() << "\n";
        fs::remove(tmp, ec);
        return 2;
      }
    }
    fs::rename(tmp, out, ec);
    if (ec) {
      err << "trainer report: cannot write " << out << ": " << ec.message() << "\n";
      fs::remove(tmp, ec);
      return 2;
    }
    if (written_path) *written_path = out;
    return 0;
  } catch (const ReportError& e) {
    err << "trainer report: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "trainer report: internal error: " << e.what() << "\n";
    return 1;
  } catch (...) {
    err << "trainer report: internal error\n";
    return 1;
  }
}

}  // namespace trainer::report
