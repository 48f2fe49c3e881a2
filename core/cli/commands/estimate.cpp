// `trainer estimate`: a training step's peak memory predicted from a few probe steps.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "command.h"
#include "estimate.h"
#include "report.h"
#include "report_memory.h"
#include "short_run.h"
#include "trainer/error.h"
#include "trainer/memory.h"

namespace trainer::cli {

namespace {

/// "8,16,32" -> {8, 16, 32}; UsageError naming the option otherwise.
std::vector<std::int64_t> parse_sizes(const std::string& text, const std::string& option) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TRAINER_CHECK_T(UsageError, used == item.size() && !item.empty() && v >= 1, option, " '", text,
                    "': expected positive integers separated by commas, e.g. 8,16,32");
    out.push_back(v);
  }
  return out;
}

/// A step of a run's memory.jsonl to set beside the prediction.
struct MeasuredStep {
  std::int64_t step = 0, micro_batch = 0;
  MemoryBreakdown split;  ///< at the step's peak
};

/// RUN_DIR's memory.jsonl steps; UsageError when it has none.
std::vector<report::MemoryStep> measured_steps(const std::string& dir) {
  report::RunData d;
  report::read_memory_map(dir, d);
  TRAINER_CHECK_T(UsageError, !d.memory_steps.empty(), "--measured ", dir,
                  ": no step lines in its memory.jsonl (a run writes them with memory.categories = true, on the CPU)");
  return std::move(d.memory_steps);
}

/// Of `steps` (not empty), the one with the highest peak among those at micro-batch `micro`, else
/// among those at the last step's micro-batch.
MeasuredStep measured_step(const std::vector<report::MemoryStep>& steps, std::int64_t micro) {
  double at = micro;
  const auto has = [&](double m) {
    return std::any_of(steps.begin(), steps.end(), [&](const auto& s) { return s.micro_batch == m; });
  };
  if (!has(at)) at = steps.back().micro_batch;
  const report::MemoryStep* best = nullptr;
  double best_total = -1;
  for (const auto& s : steps) {
    double total = 0;
    for (const double b : s.peak) total += b;
    if (s.micro_batch == at && total > best_total) best = &s, best_total = total;
  }
  MeasuredStep out;
  out.step = static_cast<std::int64_t>(best->step);
  out.micro_batch = static_cast<std::int64_t>(best->micro_batch);
  for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) {
    out.split.bytes[i] = static_cast<std::int64_t>(best->peak[i]);
    out.split.allocated += out.split.bytes[i];
  }
  out.split.reserved = out.split.allocated;
  return out;
}

std::string difference(std::int64_t predicted, std::int64_t measured) {
  if (measured == 0) return predicted == 0 ? "=" : "(none measured)";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f %%", 100.0 * double(predicted - measured) / double(measured));
  return buf;
}

}  // namespace

Command estimate_command() {
  Command c;
  c.name = "estimate";
  c.synopsis =
      "trainer estimate --recipe FILE [OVERRIDE...] [--find-max-batch] [--margin F] [--probe-sizes A,B,C] "
      "[--lengths A,B,C] [--measured RUN_DIR] [--json]";
  c.summary =
      "predict a training step's peak memory from a few probe\n"
      "steps: breakdown, whether it fits the budget or device,\n"
      "the largest micro-batch that does (docs/memory.md)";
  c.options = [](po::options_description& d) {
    d.add_options()                                                                                     //
        ("recipe,r", po::value<std::string>(), "recipe TOML file")                                      //
        ("plugin-dir", po::value<std::vector<std::string>>(), "extra plugin directory (repeatable)")    //
        ("find-max-batch", "confirm the largest micro-batch with real steps")                           //
        ("margin", po::value<double>()->default_value(0.10, "0.1"), "fraction of the limit kept free")  //
        ("probe-sizes", po::value<std::string>(), "micro-batches probed, e.g. 8,16,32")                 //
        ("lengths", po::value<std::string>(),
         "sequence lengths probed (dataset.max_length, every batch padded to it), e.g. 64,128,256")  //
        ("measured", po::value<std::string>(),
         "a run directory of this recipe: its memory.jsonl's split beside the predicted breakdown")  //
        ("json", "print JSON");
  };
  c.run = [](const Invocation& in) -> int {
    TRAINER_CHECK_T(UsageError, in.vm.count("recipe"), "--recipe is required");
    tune::EstimateRequest req;
    req.recipe = in.vm["recipe"].as<std::string>();
    req.overrides = in.args;
    req.plugin_dirs = in.plugin_dirs;
    req.margin = in.vm["margin"].as<double>();
    if (in.vm.count("probe-sizes")) {
      req.probe_sizes = parse_sizes(in.vm["probe-sizes"].as<std::string>(), "--probe-sizes");
    }
    if (in.vm.count("lengths")) req.lengths = parse_sizes(in.vm["lengths"].as<std::string>(), "--lengths");
    // Ctrl-C stops the probe in progress (its directory removed) and the estimate (exit 130).
    tune::stop_on_signals();
    // A run directory to compare with is read first: a wrong one fails before the probes run.
    std::optional<MeasuredStep> measured;
    std::string measured_dir;
    std::vector<report::MemoryStep> steps;
    if (in.vm.count("measured")) {
      measured_dir = in.vm["measured"].as<std::string>();
      steps = measured_steps(measured_dir);
    }
    tune::MemoryEstimate e = tune::estimate_memory(req);
    if (!steps.empty()) measured = measured_step(steps, e.micro_batch);
    if (in.vm.count("find-max-batch")) tune::find_max_batch(req, e);
    std::vector<tune::BreakdownRow> rows;
    if (measured) rows = tune::compare_breakdown(e, e.batch_size, measured->micro_batch, measured->split);
    if (in.vm.count("json")) {
      std::ostringstream text;
      tune::print_estimate_json(e, text);
      if (!measured) {
        std::cout << text.str();
        return kExitOk;
      }
      auto j = nlohmann::json::parse(text.str());
      nlohmann::json rs = nlohmann::json::array();
      for (const auto& r : rows) rs.push_back({{"name", r.name}, {"predicted", r.predicted}, {"measured", r.measured}});
      j["measured"] = {
          {"run_dir", measured_dir}, {"step", measured->step}, {"micro_batch", measured->micro_batch}, {"rows", rs}};
      std::cout << j.dump() << "\n";
      return kExitOk;
    }
    tune::print_estimate(e, std::cout);
    if (measured) {
      std::cout << "\n  measured: " << measured_dir << "/memory.jsonl, step " << measured->step << " at micro-batch "
                << measured->micro_batch << " (batch " << e.batch_size << "), the step's peak by category:\n";
      char line[160];
      std::snprintf(line, sizeof line, "    %-44s %12s %12s  %s\n", "", "predicted", "measured", "difference");
      std::cout << line;
      for (const auto& r : rows) {
        std::snprintf(line, sizeof line, "    %-44s %12s %12s  %s\n", r.name.c_str(), format_bytes(r.predicted).c_str(),
                      format_bytes(r.measured).c_str(), difference(r.predicted, r.measured).c_str());
        std::cout << line;
      }
    }
    return kExitOk;
  };
  return c;
}

}  // namespace trainer::cli
