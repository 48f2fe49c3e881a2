// `trainer estimate`: a training step's peak memory predicted from a few probe steps.
#include <iostream>
#include <sstream>

#include "command.h"
#include "estimate.h"
#include "short_run.h"
#include "trainer/error.h"

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

}  // namespace

Command estimate_command() {
  Command c;
  c.name = "estimate";
  c.synopsis =
      "trainer estimate --recipe FILE [OVERRIDE...] [--find-max-batch] [--margin F] [--probe-sizes A,B,C] "
      "[--lengths A,B,C] [--json]";
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
    tune::MemoryEstimate e = tune::estimate_memory(req);
    if (in.vm.count("find-max-batch")) tune::find_max_batch(req, e);
    if (in.vm.count("json")) {
      tune::print_estimate_json(e, std::cout);
    } else {
      tune::print_estimate(e, std::cout);
    }
    return kExitOk;
  };
  return c;
}

}  // namespace trainer::cli
