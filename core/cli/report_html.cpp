// The report's page: render_html() puts the header, the notes, the charts drawn from the metrics
// and the log's warnings and the config together.
#include "report.h"

#include "report_chart.h"
#include "report_memory.h"
#include "report_sections.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

namespace trainer::report {
namespace {

constexpr std::size_t kMaxListedNames = 10;  // metric names listed in one note

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd",
                                    "#8c564b", "#e377c2", "#17becf", "#7f7f7f"};
constexpr const char* kOomColour = "#d62728";
constexpr const char* kMicroBatchColour = "#b8860b";
constexpr const char* kResumeColour = "#555555";

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

/// A `trainer lr-find` run: the loss and the smoothed loss over the learning rate (a log axis),
/// the suggestion marked and said in words.
std::string lr_find_section(const LrFindData& f) {
  Chart c{"Loss over the learning rate", "learning rate", "training loss", false, 1200, 360, {}, {}};
  c.x_log10 = true;
  Line loss{"train/loss", kPalette[0], {}, true}, smoothed{"smoothed", kPalette[1], {}, false};
  for (const auto& p : f.points) {
    loss.points.push_back({std::log10(p.lr), p.loss, p.step});
    smoothed.points.push_back({std::log10(p.lr), p.smoothed, p.step});
  }
  c.lines = {loss, smoothed};
  std::string words;
  if (f.suggested_lr) {
    const std::string lr = format_number(*f.suggested_lr, 3);
    c.markers.push_back({std::log10(*f.suggested_lr), "suggested " + lr,
                         "the smoothed loss falls fastest at learning rate " + lr, kOomColour, "suggestion"});
    words = "Suggested learning rate: <b>" + html_escape(lr) + "</b> (where the smoothed loss falls fastest): <code>" +
            html_escape("optim.lr=" + lr) + "</code>.";
  } else {
    words = "No suggestion: " + html_escape(f.no_suggestion.empty() ? "none recorded" : f.no_suggestion) + ".";
  }
  if (!f.stopped.empty()) words += " The sweep stopped early: " + html_escape(f.stopped) + ".";
  return "<section><h2>Learning-rate finder</h2>\n<p>" + words + "</p>\n" + figure(c) + "</section>\n";
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
const std::vector<std::string> kEventNames = {"oom/micro_batch_size", "train/micro_batch_size", "resume/step"};

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
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
  const std::size_t events = ooms.size() + changes.size();  // each drawn as a marker
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
  if (!d.lr_find_error.empty()) notes.push_back(d.lr_find_error);
  if (d.lr_find && d.lr_find->bad_points > 0) {
    notes.push_back("lr_find.json: " + std::to_string(d.lr_find->bad_points) +
                    " points without a step and a positive learning rate left out.");
  }
  if (!notes.empty()) {
    h << "<section class=\"card notes\"><h2>Notes</h2><ul>\n";
    for (const auto& n : notes) h << "<li>" << html_escape(n) << "</li>\n";
    h << "</ul></section>\n";
  }

  if (d.lr_find) h << lr_find_section(*d.lr_find);

  std::vector<std::string> training;
  for (const auto& spec : step_charts()) {
    Chart c{spec.title, "step", spec.y_label, true, 600, 300, {}, {}};
    for (std::size_t i = 0; i < spec.names.size(); ++i) {
      if (logged(d, spec.names[i])) c.lines.push_back(step_line(d, spec.names[i], kPalette[i]));
    }
    // Where the run resumed (a run resumed in place from an earlier step draws over its steps again).
    if (const auto resumes = d.metrics.find("resume/step"); !c.lines.empty() && resumes != d.metrics.end()) {
      for (const auto& p : resumes->second) {
        if (c.markers.size() == kMaxMarkers) break;
        const std::string label = "resumed";
        c.markers.push_back({p.step, label, "resumed at step " + format_number(p.step, 12), kResumeColour, "resume"});
      }
    }
    if (!c.lines.empty()) training.push_back(figure(c));
  }
  if (!training.empty())
    h << "<section><h2>Training</h2><div class=\"grid2\">\n" << join(training, "") << "</div></section>\n";

  if (memory_chart) {
    // In steps, as every chart (what happened before the first step is drawn at step 0; the
    // table below gives each event's time).
    const double t0 = std::isfinite(t_first) ? t_first : 0;
    Chart c{"Memory", "step", "MB", true, 1200, 360, {}, {}};
    const char* const colours[] = {"#1f77b4", "#2ca02c", "#9467bd"};
    for (std::size_t i = 0; i < kMemoryNames.size(); ++i) {
      const auto it = d.metrics.find(kMemoryNames[i]);
      if (it == d.metrics.end()) continue;
      Line l{kMemoryNames[i], colours[i], {}, kMemoryNames[i] == "memory/reserved_mb"};
      for (const auto& p : it->second) l.points.push_back({p.step, p.value, p.step});
      c.lines.push_back(std::move(l));
    }
    for (const auto& e : ooms) {
      const std::string label = "OOM (micro-batch " + format_number(e.micro_batch) + ")";
      c.markers.push_back(
          {e.step, label, label + " at step " + format_number(e.step, 12), kOomColour, "out-of-memory error"});
    }
    for (const auto& ch : changes) {
      const std::string label = "micro-batch " + format_number(ch.from) + " → " + format_number(ch.to);
      c.markers.push_back(
          {ch.step, label, label + " at step " + format_number(ch.step, 12), kMicroBatchColour, "micro-batch change"});
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

  h << memory_map_section(d);

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

}  // namespace trainer::report
