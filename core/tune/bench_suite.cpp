#include "bench_suite.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>

#include "estimate.h"
#include "short_run.h"
#include "trainer/core_settings.h"
#include "trainer/error.h"
#include "trainer/memory.h"
#include "trainer/recipe.h"

namespace trainer::tune {

const char* cell_status_name(CellStatus status) {
  static constexpr const char* kNames[] = {"ok", "oom", "predicted_oom", "failed"};  // CellStatus's order
  return kNames[static_cast<std::size_t>(status)];
}

std::ostream& operator<<(std::ostream& os, CellStatus status) { return os << cell_status_name(status); }
namespace {

std::string value_of(const std::string& override_text) {
  const auto eq = override_text.find('=');
  return eq == std::string::npos ? override_text : override_text.substr(eq + 1);
}

double in_mib(std::int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

/// The columns of a cell's row after its grid values.
std::vector<std::string> result_columns(const BenchCell& c) {
  const bool ran = c.measured_steps > 0;
  return {cell_status_name(c.status),
          std::to_string(c.micro_batch_used > 0 ? c.micro_batch_used : c.micro_batch),
          ran ? fixed(c.samples_per_s, 1) : "",
          ran ? fixed(c.step_ms_median, 2) : "",
          ran ? fixed(c.step_ms_min, 2) + "-" + fixed(c.step_ms_max, 2) : "",
          c.peak > 0 ? fixed(in_mib(c.peak), 1) : "",
          c.predicted_peak >= 0 ? fixed(in_mib(c.predicted_peak), 1) : "",
          c.out_of_memory ? "yes" : "no",
          c.message};
}

const std::vector<std::string> kResultHeader = {"status",
                                                "micro-batch used",
                                                "samples/s",
                                                "step ms (median)",
                                                "step ms (min-max)",
                                                "peak MiB",
                                                "predicted peak MiB",
                                                "out of memory",
                                                "note"};

}  // namespace

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

std::vector<GridAxis> parse_grid(const std::string& text) {
  std::vector<GridAxis> axes;
  std::vector<std::string> tokens;
  std::string cur;
  int depth = 0;
  char quote = 0;
  for (char ch : text + " ") {
    if (quote) {
      if (ch == quote) quote = 0;
      cur += ch;
    } else if (ch == '"' || ch == '\'') {
      quote = ch;
      cur += ch;
    } else if (ch == '[') {
      ++depth, cur += ch;
    } else if (ch == ']') {
      --depth, cur += ch;
    } else if ((ch == ' ' || ch == '\t') && depth == 0) {
      if (!cur.empty()) tokens.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  TRAINER_CHECK_T(UsageError, quote == 0 && depth == 0, "--grid '", text, "': unbalanced quotes or brackets");
  TRAINER_CHECK_T(UsageError, !tokens.empty(), "--grid is empty: expected \"key=v1,v2 key2=v3,v4\"");
  for (const auto& t : tokens) {
    const auto eq = t.find('=');
    TRAINER_CHECK_T(UsageError, eq != std::string::npos && eq > 0 && eq + 1 < t.size(), "--grid: '", t,
                    "' is not key=v1,v2,... (e.g. training.micro_batch_size=32,64 or model=mlp,cnn)");
    GridAxis axis{t.substr(0, eq), {}};
    for (const auto& a : axes) {
      TRAINER_CHECK_T(UsageError, a.key != axis.key, "--grid names '", axis.key, "' twice");
    }
    std::string v;
    int d = 0;
    char q = 0;
    for (char ch : t.substr(eq + 1) + ",") {
      if (q) {
        if (ch == q) q = 0;
        v += ch;
      } else if (ch == '"' || ch == '\'') {
        q = ch, v += ch;
      } else if (ch == '[') {
        ++d, v += ch;
      } else if (ch == ']') {
        --d, v += ch;
      } else if (ch == ',' && d == 0) {
        TRAINER_CHECK_T(UsageError, !v.empty(), "--grid: '", t, "' has an empty value");
        axis.values.push_back(v);
        v.clear();
      } else {
        v += ch;
      }
    }
    axes.push_back(std::move(axis));
  }
  return axes;
}

std::vector<std::vector<std::string>> grid_cells(const std::vector<GridAxis>& axes) {
  std::vector<std::vector<std::string>> cells{{}};
  for (const auto& axis : axes) {
    std::vector<std::vector<std::string>> next;
    for (const auto& c : cells) {
      for (const auto& v : axis.values) {
        auto n = c;
        n.push_back(axis.key + "=" + v);
        next.push_back(std::move(n));
      }
    }
    cells = std::move(next);
  }
  return cells;
}

BenchReport run_bench(const BenchRequest& req, std::ostream& progress) {
  TRAINER_CHECK_T(UsageError, req.steps >= 1, "--steps ", req.steps, ": at least 1 measured step");
  TRAINER_CHECK_T(UsageError, req.warmup >= 0, "--warmup ", req.warmup, ": 0 or more");
  TRAINER_CHECK_T(UsageError, req.margin >= 0 && req.margin < 1, "--margin ", req.margin,
                  " is outside [0, 1): it is the fraction of the limit kept free");
  BenchReport report;
  for (const auto& a : req.grid) report.keys.push_back(a.key);
  // Every cell's config is checked before anything runs: a typo in the last cell is not found
  // after an hour of the others.
  const auto cells = grid_cells(req.grid);
  std::vector<std::string> memory_keys;  // per cell: what its memory estimate depends on
  for (const auto& overrides : cells) {
    BenchCell c;
    c.overrides = overrides;
    std::vector<std::string> all = req.overrides;
    all.insert(all.end(), overrides.begin(), overrides.end());
    const PreparedRun p = prepare_run(req.recipe, all, req.plugin_dirs);
    const auto t = TrainingSettings::from(p.config.sub("training"));
    c.batch_size = t.batch_size;
    c.micro_batch = t.micro_batch();
    memory_keys.push_back(memory_key(overrides, p));
    report.cells.push_back(std::move(c));
  }
  // Cells that differ only in their batch sizes (and keys that change no memory) share one
  // estimate (its fit covers every size), probed for the largest micro-batch among them.
  std::map<std::string, std::int64_t> largest_micro;
  for (std::size_t i = 0; i < report.cells.size(); ++i) {
    largest_micro[memory_keys[i]] = std::max(largest_micro[memory_keys[i]], report.cells[i].micro_batch);
  }
  std::map<std::string, MemoryEstimate> estimates;
  std::map<std::string, std::string> failed_estimates;  // a group whose estimate failed: why
  for (std::size_t i = 0; i < report.cells.size(); ++i) {
    BenchCell& c = report.cells[i];
    bool predicted_oom = false;
    std::vector<std::string> all = req.overrides;
    all.insert(all.end(), c.overrides.begin(), c.overrides.end());
    if (req.estimate) {
      const std::string& key = memory_keys[i];
      try {
        auto it = estimates.find(key);
        if (it == estimates.end() && !failed_estimates.count(key)) {
          EstimateRequest er;
          er.recipe = req.recipe;
          er.overrides = all;
          er.plugin_dirs = req.plugin_dirs;
          er.margin = req.margin;
          er.work_dir = req.work_dir;
          er.probe_sizes = default_probe_sizes(largest_micro[key]);
          it = estimates.emplace(key, estimate_memory(er)).first;
        }
        if (it != estimates.end()) {
          const MemoryEstimate& e = it->second;
          if (report.device.empty()) report.device = e.device;
          c.predicted_peak = e.peak > 0 ? e.predict(c.batch_size, c.micro_batch) : -1;
          if (e.peak == 0 || !e.fits_at(c.batch_size, c.micro_batch)) {
            c.status = CellStatus::PredictedOom;
            predicted_oom = true;
            c.message = e.peak == 0
                            ? "the smallest probe ran out of memory"
                            : "predicted " +
                                  format_bytes(e.limit_on_reserved ? e.predict_reserved(c.batch_size, c.micro_batch)
                                                                   : c.predicted_peak) +
                                  " > " + format_bytes(std::int64_t(double(e.limit) * (1.0 - e.margin))) + " usable (" +
                                  e.limit_source + ")";
          }
        }
      } catch (const UsageError&) {
        throw;  // the cell's own error (ConfigError is one too), not the estimate's: exit 2
      } catch (const Interrupted&) {
        throw;  // Ctrl-C during the cell's estimate ends the suite
      } catch (const Error& e) {
        // Not knowing is not a reason to skip: the cell runs and shows what happens.
        failed_estimates[key] = e.what();
      }
      if (failed_estimates.count(key)) c.message = "not estimated: " + failed_estimates[key];
    }
    if (!predicted_oom) {
      ShortRunSpec spec;
      spec.recipe = req.recipe;
      spec.overrides = all;
      spec.plugin_dirs = req.plugin_dirs;
      spec.steps = req.warmup + req.steps;
      spec.keep_budget = true;
      spec.keep_oom_backoff = true;
      spec.work_dir = req.work_dir;
      spec.label = "bench-cell-" + std::to_string(i);
      const ShortRunResult r = run_short(spec);
      if (report.device.empty()) report.device = r.device;
      c.out_of_memory = r.out_of_memory;
      c.peak = r.peak();
      if (!r.steps.empty()) c.micro_batch_used = r.steps.back().micro_batch;
      std::vector<double> ms;
      double seconds = 0;
      std::int64_t samples = 0;
      for (std::size_t s = static_cast<std::size_t>(req.warmup); s < r.steps.size(); ++s) {
        ms.push_back(1000.0 * r.steps[s].seconds);
        seconds += r.steps[s].seconds;
        samples += r.steps[s].samples;
      }
      c.measured_steps = static_cast<std::int64_t>(ms.size());
      if (!ms.empty()) {
        std::sort(ms.begin(), ms.end());
        c.step_ms_median = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
        c.step_ms_min = ms.front();
        c.step_ms_max = ms.back();
        c.samples_per_s = seconds > 0 ? double(samples) / seconds : 0;
      }
      if (r.exit_code != 0) {
        c.status = r.out_of_memory ? CellStatus::Oom : CellStatus::Failed;
        c.message = (c.message.empty() ? "" : c.message + "; ") + r.message;
      } else if (c.measured_steps < req.steps) {
        c.status = CellStatus::Failed;
        c.message = "ran " + std::to_string(r.steps.size()) + " of " + std::to_string(spec.steps) +
                    " steps: the training set or training.epochs is too small for --warmup + --steps";
      } else {
        c.status = CellStatus::Ok;
        if (r.out_of_memory) {
          c.message = (c.message.empty() ? "" : c.message + "; ") + "ran out of memory at micro-batch " +
                      std::to_string(r.oom_micro_batch) + " (" + (r.oom_phase ? oom_phase_name(*r.oom_phase) : "?") +
                      "), went on at " + std::to_string(c.micro_batch_used);
        }
      }
    }
    progress << "cell " << (i + 1) << "/" << report.cells.size() << ":";
    for (const auto& o : c.overrides) progress << " " << o;
    progress << " -> " << c.status;
    if (c.status == CellStatus::Ok)
      progress << ", " << fixed(c.samples_per_s, 1) << " samples/s, peak " << format_bytes(c.peak);
    if (!c.message.empty()) progress << " (" << c.message << ")";
    progress << "\n";
  }
  return report;
}

void print_bench_table(const BenchReport& r, std::ostream& out) {
  std::vector<std::string> header = r.keys;
  header.insert(header.end(), kResultHeader.begin(), kResultHeader.end() - 1);  // the note goes below
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : r.cells) {
    std::vector<std::string> row;
    for (const auto& o : c.overrides) row.push_back(value_of(o));
    auto res = result_columns(c);
    row.insert(row.end(), res.begin(), res.end() - 1);
    rows.push_back(std::move(row));
  }
  std::vector<std::size_t> width(header.size());
  for (std::size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  const auto line = [&](const std::vector<std::string>& cells) {
    for (std::size_t i = 0; i < cells.size(); ++i)
      out << (i ? "  " : "") << std::left << std::setw(int(width[i])) << cells[i];
    out << "\n";
  };
  out << "bench on " << (r.device.empty() ? "?" : r.device) << ":\n";
  line(header);
  for (const auto& row : rows) line(row);
  for (std::size_t i = 0; i < r.cells.size(); ++i) {
    if (!r.cells[i].message.empty()) out << "  cell " << (i + 1) << ": " << r.cells[i].message << "\n";
  }
}

void write_bench_csv(const BenchReport& r, std::ostream& out) {
  std::vector<std::string> header = r.keys;
  for (const auto& h : {"status", "micro_batch_used", "samples_per_s", "step_ms_median", "step_ms_min", "step_ms_max",
                        "peak_mib", "predicted_peak_mib", "out_of_memory", "measured_steps", "note"}) {
    header.emplace_back(h);
  }
  for (std::size_t i = 0; i < header.size(); ++i) out << (i ? "," : "") << csv_field(header[i]);
  out << "\n";
  for (const auto& c : r.cells) {
    std::vector<std::string> row;
    for (const auto& o : c.overrides) row.push_back(value_of(o));
    const bool ran = c.measured_steps > 0;
    for (const auto& v : std::vector<std::string>{
             cell_status_name(c.status), std::to_string(c.micro_batch_used > 0 ? c.micro_batch_used : c.micro_batch),
             ran ? fixed(c.samples_per_s, 3) : "", ran ? fixed(c.step_ms_median, 3) : "",
             ran ? fixed(c.step_ms_min, 3) : "", ran ? fixed(c.step_ms_max, 3) : "",
             c.peak > 0 ? fixed(in_mib(c.peak), 3) : "",
             c.predicted_peak >= 0 ? fixed(in_mib(c.predicted_peak), 3) : "", c.out_of_memory ? "true" : "false",
             std::to_string(c.measured_steps), c.message}) {
      row.push_back(v);
    }
    for (std::size_t i = 0; i < row.size(); ++i) out << (i ? "," : "") << csv_field(row[i]);
    out << "\n";
  }
}

void write_bench_markdown(const BenchReport& r, std::ostream& out) {
  std::vector<std::string> header = r.keys;
  header.insert(header.end(), kResultHeader.begin(), kResultHeader.end());
  const auto esc = [](std::string s) {
    std::string o;
    for (char ch : s) o += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return o;
  };
  out << "|";
  for (const auto& h : header) out << " " << esc(h) << " |";
  out << "\n|";
  for (std::size_t i = 0; i < header.size(); ++i) out << (i < r.keys.size() ? "---|" : "---:|");
  out << "\n";
  for (const auto& c : r.cells) {
    out << "|";
    for (const auto& o : c.overrides) out << " " << esc("`" + value_of(o) + "`") << " |";
    for (const auto& v : result_columns(c)) out << " " << esc(v) << " |";
    out << "\n";
  }
}

}  // namespace trainer::tune
