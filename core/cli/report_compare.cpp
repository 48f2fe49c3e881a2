// `trainer report RUN_DIR RUN_DIR...`: several runs on one page, overlaid. Each chart has a
// line per run (x in optimizer steps, memory too), the legend names the runs, and a table
// lists the config keys whose values differ.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "report.h"
#include "report_chart.h"
#include "report_sections.h"

namespace trainer::report {

namespace {

namespace fs = std::filesystem;

constexpr const char* kRunColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                       "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

/// The charts of a comparison, in order; each drawn when a run logged its metric.
const std::vector<std::pair<std::string, std::string>>& compared_metrics() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"train/loss", "loss"},         {"eval/loss", "loss"},         {"eval/accuracy", "accuracy"},
      {"train/accuracy", "accuracy"}, {"train/lr", "learning rate"}, {"train/samples_per_s", "samples/s"},
      {"memory/peak_mb", "MB"},       {"memory/allocated_mb", "MB"}, {"memory/reserved_mb", "MB"},
  };
  return m;
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

/// The brackets a line opens minus those it closes, outside strings.
int bracket_balance(const std::string& s) {
  int depth = 0;
  char quote = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == '\\' && quote == '"')
        ++i;
      else if (c == quote)
        quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      break;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return depth;
}

}  // namespace

std::map<std::string, std::string> config_leaves(const std::string& toml) {
  std::map<std::string, std::string> out;
  std::istringstream in(toml);
  std::string line, table;
  while (std::getline(in, line)) {
    const std::string t = trimmed(line);
    if (t.empty() || t[0] == '#') continue;
    if (t[0] == '[') {  // [table] (an array of tables, [[x]], is not one of config.toml's)
      const auto close = t.find(']');
      table = t.rfind("[[", 0) == 0 || close == std::string::npos ? "" : trimmed(t.substr(1, close - 1));
      continue;
    }
    const auto eq = t.find('=');
    if (eq == std::string::npos) continue;
    std::string key = trimmed(t.substr(0, eq)), value = trimmed(t.substr(eq + 1));
    // A value over several lines (a long array): the lines until its brackets close.
    for (int depth = bracket_balance(value), lines = 0; depth > 0 && lines < 1000 && std::getline(in, line); ++lines) {
      const std::string more = trimmed(line);
      value += " " + more;
      depth += bracket_balance(more);
    }
    if (key.size() > 1 && key.front() == '"' && key.back() == '"') key = key.substr(1, key.size() - 2);
    out[table.empty() ? key : table + "." + key] = value;
  }
  return out;
}

std::string render_comparison(const std::vector<RunData>& runs) {
  // A label per run: its directory's name, with its parent where two runs share a name.
  std::vector<std::string> labels;
  std::map<std::string, int> seen;
  for (const auto& r : runs) ++seen[r.name];
  for (const auto& r : runs) {
    const fs::path parent = fs::path(r.dir).lexically_normal().parent_path();
    labels.push_back(seen[r.name] > 1 && !parent.filename().empty() ? parent.filename().string() + "/" + r.name
                                                                    : r.name);
  }
  const auto colour = [](std::size_t i) { return kRunColours[i % std::size(kRunColours)]; };

  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    << "<title>Run comparison: " << runs.size() << " runs</title>\n<style>" << kStyle
    << "</style>\n</head>\n<body>\n<main>\n";
  h << "<header class=\"card\"><h1>" << runs.size() << " runs compared</h1>\n"
    << "<table><tr><th>run</th><th>status</th><th>steps</th><th>last eval/accuracy</th><th>last eval/loss</th>"
    << "<th>directory</th></tr>\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RunData& d = runs[i];
    const auto last = [&d](const std::string& name) {
      const auto it = d.metrics.find(name);
      return it == d.metrics.end() || it->second.empty() ? std::string("–") : format_number(it->second.back().value, 4);
    };
    std::string steps = "–";
    if (d.status) {
      steps = std::to_string(d.status->global_step);
    } else if (const auto it = d.metrics.find("train/loss"); it != d.metrics.end() && !it->second.empty()) {
      steps = format_number(it->second.back().step, 12) + " (last logged)";
    }
    h << "<tr><td><span style=\"color:" << colour(i) << "\">■</span> " << html_escape(labels[i]) << "</td><td>"
      << html_escape(d.status ? run_status_name(d.status->status) : "RUNNING or unknown") << "</td><td>"
      << html_escape(steps) << "</td><td>" << last("eval/accuracy") << "</td><td>" << last("eval/loss")
      << "</td><td class=\"path\">" << html_escape(d.dir) << "</td></tr>\n";
  }
  h << "</table></header>\n";

  // The config keys whose values differ (or that a run lacks).
  std::vector<std::map<std::string, std::string>> configs;
  std::set<std::string> keys;
  std::vector<std::string> without_config;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    configs.push_back(runs[i].config_toml ? config_leaves(*runs[i].config_toml) : std::map<std::string, std::string>{});
    if (!runs[i].config_toml) without_config.push_back(labels[i]);
    for (const auto& [k, v] : configs.back()) keys.insert(k);
  }
  std::vector<std::string> differing;
  for (const auto& k : keys) {
    std::set<std::string> values;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (!runs[i].config_toml) continue;
      const auto it = configs[i].find(k);
      values.insert(it == configs[i].end() ? std::string("\x01") : it->second);
    }
    if (values.size() > 1) differing.push_back(k);
  }
  h << "<section class=\"card\"><h2>Config differences</h2>\n";
  if (!without_config.empty()) {
    std::string names;
    for (const auto& n : without_config) names += (names.empty() ? "" : ", ") + n;
    h << "<p>No config.toml in " << html_escape(names) << ": left out of this table.</p>\n";
  }
  if (differing.empty()) {
    h << "<p>The runs' configs hold the same values.</p>\n";
  } else {
    h << "<table><tr><th>key</th>";
    for (const auto& l : labels) h << "<th>" << html_escape(l) << "</th>";
    h << "</tr>\n";
    for (std::size_t k = 0; k < differing.size(); ++k) {
      if (k == kMaxEventRows) {
        h << "<tr><td colspan=\"" << runs.size() + 1 << "\">… and " << differing.size() - k << " more</td></tr>\n";
        break;
      }
      h << "<tr><td><code>" << html_escape(differing[k]) << "</code></td>";
      for (std::size_t i = 0; i < runs.size(); ++i) {
        const auto it = configs[i].find(differing[k]);
        h << "<td>" << (it == configs[i].end() ? std::string("(not set)") : html_escape(it->second)) << "</td>";
      }
      h << "</tr>\n";
    }
    h << "</table>\n";
  }
  h << "</section>\n";

  // One chart per metric, a line per run, x in steps.
  std::vector<std::string> figures;
  std::vector<std::string> missing;
  for (const auto& [name, y_label] : compared_metrics()) {
    Chart c{name, "step", y_label, true, 600, 300, {}, {}};
    std::vector<std::string> lacking;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const auto it = runs[i].metrics.find(name);
      if (it == runs[i].metrics.end()) {
        lacking.push_back(labels[i]);
        continue;
      }
      Line l{labels[i], colour(i), {}, false};
      for (const auto& p : it->second) l.points.push_back({p.step, p.value, p.step});
      c.lines.push_back(std::move(l));
    }
    if (c.lines.empty()) continue;
    figures.push_back("<figure class=\"card chart\"><h3>" + html_escape(name) + "</h3>\n" + render_svg(c) +
                      "</figure>\n");
    if (!lacking.empty()) {
      std::string names;
      for (const auto& n : lacking) names += (names.empty() ? "" : ", ") + n;
      missing.push_back(name + ": not logged by " + names);
    }
  }
  if (!missing.empty()) {
    h << "<section class=\"card notes\"><h2>Notes</h2><ul>\n";
    for (const auto& m : missing) h << "<li>" << html_escape(m) << "</li>\n";
    h << "</ul></section>\n";
  }
  h << "<section><h2>Metrics</h2><div class=\"grid2\">\n";
  for (const auto& f : figures) h << f;
  h << "</div></section>\n";
  h << "<footer>trainer report · " << runs.size() << " runs</footer>\n</main>\n</body>\n</html>\n";
  return h.str();
}

int write_comparison(const std::vector<std::string>& run_dirs, const std::string& out_path, std::ostream& err,
                     std::string* written_path) {
  return write_page(
      [&] {
        std::vector<RunData> runs;
        for (const auto& dir : run_dirs) runs.push_back(read_run(dir));
        const std::string html = render_comparison(runs);
        if (!out_path.empty()) return std::make_pair(out_path, html);
        std::error_code ec;
        fs::path first = fs::absolute(run_dirs.front(), ec).lexically_normal();
        if (ec) first = fs::path(run_dirs.front()).lexically_normal();
        const fs::path parent = first.has_filename() ? first.parent_path() : first.parent_path().parent_path();
        return std::make_pair((parent / "compare.html").string(), html);
      },
      err, written_path);
}

}  // namespace trainer::report
