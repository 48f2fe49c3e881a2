#include "report_memory.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <vector>

#include "report_chart.h"
#include "report_files.h"
#include "report_sections.h"
#include "trainer/json.h"

namespace trainer::report {
namespace {

namespace fs = std::filesystem;

// A colour per category, kMemoryCategoryNames' order.
constexpr const char* kCategoryColours[kMemoryCategoryCount] = {"#7f7f7f", "#d62728", "#9467bd", "#8c564b",
                                                                "#ff7f0e", "#2ca02c", "#17becf", "#1f77b4"};
constexpr const char* kOomMark = "#d62728";
constexpr const char* kMicroBatchMark = "#b8860b";
constexpr double kMiB = 1024.0 * 1024.0;

/// `j[key]` when it is a number, else NaN.
double number(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kNaN;
}

std::string text(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

/// The categories of a point ({"parameters": 123, …}); unknown names and non-numbers are ignored.
CategoryBytes categories_of(const nlohmann::json& point) {
  CategoryBytes out{};
  if (!point.is_object()) return out;
  for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) {
    const double v = number(point, kMemoryCategoryNames[i]);
    if (std::isfinite(v) && v >= 0) out[i] = v;
  }
  return out;
}

/// Whether `path` is there and is itself a regular file or directory (`dir`), not a link.
bool plain(const fs::path& path, bool dir) {
  std::error_code ec;
  const auto st = fs::symlink_status(path, ec);
  return !ec && (dir ? fs::is_directory(st) : fs::is_regular_file(st));
}

void read_timeline(const fs::path& path, RunData& data) {
  if (!plain(path, false)) return;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    data.read_notes.push_back("cannot read " + path.string() + ": " + errno_text());
    return;
  }
  LineReader reader(in, kMaxTimelineBytes, kMaxTimelineLineBytes);
  std::string line;
  while (reader.next(line)) {
    // A memory.jsonl line nests 3 deep; a deeper one is not given to the parser, which recurses.
    const auto j =
        reader.too_long() || json_nesting(line) > 4 ? nlohmann::json() : nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) {
      ++data.memory_bad_lines;
      continue;
    }
    const std::string kind = text(j, "kind");
    if (kind == "step" && j.contains("peak")) {
      data.memory_steps.push_back({number(j, "step"), number(j, "micro_batch"), categories_of(j["peak"])});
    } else if (kind == "oom") {
      MemoryOom o{number(j, "step"),    text(j, "phase"),       number(j, "micro_batch"),
                  number(j, "attempt"), number(j, "requested"), std::nullopt};
      if (j.contains("live")) o.live = categories_of(j["live"]);
      data.memory_ooms.push_back(std::move(o));
    }
  }
  if (reader.budget_spent()) {
    data.read_notes.push_back(path.string() + " is larger than " + size_text(kMaxTimelineBytes) + ": its first " +
                              size_text(kMaxTimelineBytes) + " read, the rest left out.");
  }
}

void read_snapshot(const fs::path& file, RunData& data) {
  const std::string rel = "memory/" + file.filename().string();
  std::string why;
  std::uintmax_t size = 0;
  if (!plain(file, false) || !regular_file(file, why, size)) {
    data.snapshot_notes.push_back(rel + ": not a regular file, not read");
    return;
  }
  std::string body;
  if (size > kMaxSnapshotBytes || !read_start(file, body, kMaxSnapshotBytes + 1) || body.size() > kMaxSnapshotBytes) {
    data.snapshot_notes.push_back(rel + ": larger than " + size_text(kMaxSnapshotBytes) + " or unreadable, not read");
    return;
  }
  // A snapshot nests 3 deep; a deeper one is not given to the parser, which recurses.
  const auto j = json_nesting(body) > 4 ? nlohmann::json() : nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object()) {
    data.snapshot_notes.push_back(rel + ": not a JSON object, not read");
    return;
  }
  SnapshotSummary s;
  s.file = rel;
  s.step = number(j, "step");
  s.micro_batch = number(j, "micro_batch");
  s.attempt = number(j, "attempt");
  s.requested = number(j, "requested");
  s.limit = number(j, "limit");
  s.allocated = number(j, "allocated");
  s.phase = text(j, "phase");
  s.reason = text(j, "reason");
  s.largest_category = text(j, "largest_category");
  if (j.contains("categories")) s.categories = categories_of(j["categories"]);
  if (const auto it = j.find("largest"); it != j.end() && it->is_array()) {
    for (const auto& b : *it) {
      if (s.largest.size() == kSnapshotRows) break;
      if (!b.is_object()) continue;
      s.largest.push_back({number(b, "size"), text(b, "category"), text(b, "phase"), number(b, "serial")});
    }
  }
  data.snapshots.push_back(std::move(s));
}

std::string mib(double bytes) { return std::isfinite(bytes) ? format_number(bytes / kMiB, 4) + " MiB" : "?"; }

std::string number_text(double v) { return std::isfinite(v) ? format_number(v, 12) : "?"; }

/// One snapshot: what failed and where, then its largest allocations.
std::string snapshot_card(const SnapshotSummary& s) {
  std::ostringstream h;
  h << "<div class=\"card\"><h3>" << html_escape(s.file) << "</h3>\n<p>Step " << number_text(s.step) << ", "
    << html_escape(s.phase.empty() ? "outside the loop" : s.phase) << ", micro-batch " << number_text(s.micro_batch)
    << ", attempt " << (std::isfinite(s.attempt) ? format_number(s.attempt + 1, 12) : "?") << ": " << mib(s.requested)
    << " refused with " << mib(s.allocated) << " live"
    << (std::isfinite(s.limit) && s.limit > 0 ? " of a " + mib(s.limit) + " budget" : "") << "; the largest part "
    << html_escape(s.largest_category) << ".</p>\n";
  double total = 0;
  for (const double b : s.categories) total += b;
  h << "<table><tr><th>category</th><th>MiB</th><th>share</th></tr>\n";
  for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) {
    if (s.categories[i] <= 0) continue;
    h << "<tr><td>" << kMemoryCategoryNames[i] << "</td><td>" << format_number(s.categories[i] / kMiB, 4) << "</td><td>"
      << format_number(total > 0 ? 100 * s.categories[i] / total : 0, 3) << " %</td></tr>\n";
  }
  h << "</table>\n";
  if (!s.largest.empty()) {
    h << "<table><tr><th>size</th><th>category</th><th>allocated in</th><th>allocation</th></tr>\n";
    for (const auto& b : s.largest) {
      h << "<tr><td>" << mib(b.size) << "</td><td>" << html_escape(b.category) << "</td><td>"
        << html_escape(b.phase.empty() ? "(outside the loop)" : b.phase) << "</td><td>#" << number_text(b.serial)
        << "</td></tr>\n";
    }
    h << "</table>\n";
  }
  h << "</div>\n";
  return h.str();
}

}  // namespace

void read_memory_map(const fs::path& root, RunData& data) {
  read_timeline(root / "memory.1.jsonl", data);
  read_timeline(root / "memory.jsonl", data);
  const fs::path dir = root / "memory";
  if (!plain(dir, true)) return;
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("oom-", 0) == 0 && it->path().extension() == ".json") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  if (files.size() > kMaxSnapshots) {
    data.snapshot_notes.push_back(std::to_string(files.size()) + " snapshots in memory/: the last " +
                                  std::to_string(kMaxSnapshots) + " by name shown");
    files.erase(files.begin(), files.end() - static_cast<std::ptrdiff_t>(kMaxSnapshots));
  }
  for (const auto& f : files) read_snapshot(f, data);
}

std::string memory_map_section(const RunData& d) {
  if (d.memory_steps.empty() && d.memory_ooms.empty() && d.snapshots.empty() && d.snapshot_notes.empty()) return "";
  std::ostringstream h;
  h << "<section><h2>Memory by category</h2>\n<p>The split of each step's highest point "
    << "(memory.jsonl: the peak of the attempt that succeeded), in MiB";
  if (d.memory_bad_lines) h << "; " << d.memory_bad_lines << " unreadable lines skipped";
  h << ".</p>\n";
  if (!d.memory_steps.empty()) {
    Chart c{"Live memory by category at each step's peak", "step", "MiB", true, 1200, 380, {}, {}};
    c.stacked = true;
    CategoryBytes held{};
    for (const auto& p : d.memory_steps) {
      for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) held[i] = std::max(held[i], p.peak[i]);
    }
    for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) {
      if (held[i] <= 0) continue;  // a category that never held a byte
      Line l{kMemoryCategoryNames[i], kCategoryColours[i], {}, false};
      for (const auto& p : d.memory_steps) l.points.push_back({p.step, p.peak[i] / kMiB, p.step});
      c.lines.push_back(std::move(l));
    }
    for (const auto& o : d.memory_ooms) {
      const std::string label = "OOM " + o.phase + " (" + number_text(o.micro_batch) + ")";
      c.markers.push_back({o.step, label,
                           "out of memory in " + o.phase + " at step " + number_text(o.step) + ", micro-batch " +
                               number_text(o.micro_batch) + ", " + mib(o.requested) + " refused",
                           kOomMark, "out-of-memory error"});
    }
    for (std::size_t k = 1; k < d.memory_steps.size(); ++k) {
      const auto& a = d.memory_steps[k - 1];
      const auto& b = d.memory_steps[k];
      if (a.micro_batch == b.micro_batch || !std::isfinite(b.micro_batch)) continue;
      const std::string label = "micro-batch " + number_text(a.micro_batch) + " → " + number_text(b.micro_batch);
      c.markers.push_back(
          {b.step, label, label + " at step " + number_text(b.step), kMicroBatchMark, "micro-batch change"});
    }
    std::stable_sort(c.markers.begin(), c.markers.end(), [](const Marker& a, const Marker& b) { return a.x < b.x; });
    if (c.markers.size() > kMaxMarkers) c.markers.resize(kMaxMarkers);
    h << "<figure class=\"card chart\"><h3>" << html_escape(c.title) << "</h3>\n" << render_svg(c) << "</figure>\n";
  }
  if (!d.snapshots.empty() || !d.snapshot_notes.empty()) {
    h << "<h3>Out-of-memory snapshots</h3>\n";
    for (const auto& n : d.snapshot_notes) h << "<p>" << html_escape(n) << ".</p>\n";
    h << "<div class=\"grid2\">\n";
    for (const auto& s : d.snapshots) h << snapshot_card(s);
    h << "</div>\n";
  }
  h << "</section>\n";
  return h.str();
}

}  // namespace trainer::report
