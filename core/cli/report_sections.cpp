// Parts of the report's page: the header with the run's status and facts, the table of
// out-of-memory errors and micro-batch changes, and the stylesheet.
#include "report_sections.h"

#include "report_chart.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

namespace trainer::report {

std::string iso_utc(double t) {
  if (!std::isfinite(t) || std::abs(t) > 1e11) return "unknown";  // beyond year 5000: not a time
  const std::time_t s = static_cast<std::time_t>(std::floor(t));
  std::tm tm{};
  if (!gmtime_r(&s, &tm)) return "unknown";
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

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

/// The memory ladder's savers on when the run ended (status.json; oom_backoff), or nothing.
std::string savers_fact(const RunData& d) {
  if (!d.status) return "";
  std::string savers;
  auto add = [&savers](const std::string& s) { savers += (savers.empty() ? "" : "; ") + s; };
  if (d.status->checkpointed_blocks > 0) add(std::to_string(d.status->checkpointed_blocks) + " blocks checkpointed");
  if (d.status->optimizer_moment_bits > 0) {
    add("AdamW's moments in " + std::to_string(d.status->optimizer_moment_bits) + " bits");
  }
  if (d.status->optimizer_offload) add("AdamW's moments in host memory");
  return savers.empty() ? "" : fact("Memory savers on", html_escape(savers));
}

/// The optimizer steps training.on_nonfinite = "skip_step" skipped: status.json's counts, else
/// (a run still going, or ended without closing) the last logged ones; nothing when none was.
std::string skipped_steps_fact(const RunData& d) {
  double total = 0, in_a_row = 0;
  if (d.status && d.status->skipped_steps > 0) {
    total = double(d.status->skipped_steps);
    in_a_row = double(d.status->skipped_in_a_row);
  } else if (const auto it = d.metrics.find("train/skipped_steps"); it != d.metrics.end() && !it->second.empty()) {
    total = it->second.back().value;
    const auto row = d.metrics.find("train/skipped_in_a_row");
    if (row != d.metrics.end() && !row->second.empty()) in_a_row = row->second.back().value;
  }
  if (!(total > 0)) return "";
  return fact("Skipped steps", html_escape(format_number(total, 12) + " for a NaN or infinite loss or gradient, " +
                                           format_number(in_a_row, 12) + " in a row at the end"));
}

}  // namespace

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
  max-height:520px;font:12px/1.45 ui-monospace,"DejaVu Sans Mono",monospace;white-space:pre-wrap;
  overflow-wrap:anywhere}
details{margin-top:10px}
summary{cursor:pointer;color:#374151}
footer{color:#6b7280;font-size:12px;text-align:center;padding:4px 0 12px}
)";

namespace {
constexpr std::size_t kMaxListedResumes = 10;  // resumes named in the header
}  // namespace

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

  h << skipped_steps_fact(d) << savers_fact(d);

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
  const auto resumes = d.metrics.find("resume/step");
  if (resumes != d.metrics.end() && !resumes->second.empty()) {
    std::string at;
    for (std::size_t i = 0; i < resumes->second.size() && i < kMaxListedResumes; ++i) {
      const Point& p = resumes->second[i];
      at += (i ? ", " : "") + format_number(p.step, 12) + (std::isfinite(p.time) ? " (" + iso_utc(p.time) + ")" : "");
    }
    if (resumes->second.size() > kMaxListedResumes) at += ", …";
    const std::size_t n = resumes->second.size();
    h << fact("Resumed", html_escape(std::to_string(n) + (n == 1 ? " time, at step " : " times, at steps ") + at));
  }
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

}  // namespace trainer::report
