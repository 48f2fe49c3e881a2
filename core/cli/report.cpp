#include "report.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "trainer/durable_file.h"
#include "trainer/error.h"

namespace trainer::report {

namespace fs = std::filesystem;

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

int write_page(const std::function<std::pair<std::string, std::string>()>& page, std::ostream& err,
               std::string* written_path) {
  try {
    const auto [out, html] = page();
    std::error_code ec;
    if (fs::is_directory(out, ec)) {
      err << "trainer report: cannot write " << out << ": it is a directory\n";
      return 2;
    }
    // Written beside and renamed over: a browser reloading the page never sees half a report.
    // The temporary is created new: a link planted at its name (or at the page's) is replaced,
    // never written through.
    try {
      trainer::write_atomic(out, html);
    } catch (const trainer::Error& e) {
      err << "trainer report: " << e.what() << "\n";
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

int write_report(const std::string& run_dir, const std::string& out_path, std::ostream& err,
                 std::string* written_path) {
  return write_page(
      [&] {
        const std::string html = render_html(read_run(run_dir));
        return std::make_pair(out_path.empty() ? (fs::path(run_dir) / "report.html").string() : out_path, html);
      },
      err, written_path);
}

}  // namespace trainer::report
