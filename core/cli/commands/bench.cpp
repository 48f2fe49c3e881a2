// `trainer bench`: a benchmark suite over a grid of overrides.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "bench_suite.h"
#include "command.h"
#include "short_run.h"
#include "trainer/error.h"

namespace trainer::cli {

Command bench_command() {
  Command c;
  c.name = "bench";
  c.synopsis =
      "trainer bench --recipe FILE --grid \"k1=a,b k2=c,d\" [OVERRIDE...] [--steps N] [--warmup W]\n"
      "              [--csv FILE] [--md FILE] [--no-estimate] [--margin F]";
  c.summary =
      "a benchmark suite over a grid of overrides: samples/s,\n"
      "step time, peak memory, out-of-memory errors per cell;\n"
      "cells predicted not to fit are marked, not run";
  c.options = [](po::options_description& d) {
    d.add_options()                                                                                   //
        ("recipe,r", po::value<std::string>(), "recipe TOML file")                                    //
        ("plugin-dir", po::value<std::vector<std::string>>(), "extra plugin directory (repeatable)")  //
        ("grid", po::value<std::string>(), "\"key=v1,v2 key2=v3,v4\"")                                //
        ("steps", po::value<std::int64_t>()->default_value(10), "measured steps per cell")            //
        ("warmup", po::value<std::int64_t>()->default_value(2), "warm-up steps per cell")             //
        ("csv", po::value<std::string>(), "also write the results as CSV")                            //
        ("md", po::value<std::string>(), "also write the results as a Markdown table")                //
        ("no-estimate", "run every cell, also those predicted not to fit")                            //
        ("margin", po::value<double>()->default_value(0.10, "0.1"), "fraction of the limit kept free");
  };
  // 0 when every cell ran or was marked, 3 when a cell failed for another reason than memory.
  c.run = [](const Invocation& in) -> int {
    TRAINER_CHECK_T(UsageError, in.vm.count("recipe") && in.vm.count("grid"),
                    "--recipe and --grid are required: trainer bench --recipe FILE --grid \"k=a,b\"");
    tune::BenchRequest req;
    req.recipe = in.vm["recipe"].as<std::string>();
    req.overrides = in.args;
    req.plugin_dirs = in.plugin_dirs;
    req.grid = tune::parse_grid(in.vm["grid"].as<std::string>());
    req.steps = in.vm["steps"].as<std::int64_t>();
    req.warmup = in.vm["warmup"].as<std::int64_t>();
    req.estimate = in.vm.count("no-estimate") == 0;
    req.margin = in.vm["margin"].as<double>();
    const auto open = [](const std::string& path) {
      auto f = std::make_unique<std::ofstream>(path);
      TRAINER_CHECK_T(UsageError, f->good(), "cannot write '", path, "'");
      return f;
    };
    // The files are opened first: a path that cannot be written fails before the suite runs.
    const auto csv = in.vm.count("csv") ? open(in.vm["csv"].as<std::string>()) : nullptr;
    const auto md = in.vm.count("md") ? open(in.vm["md"].as<std::string>()) : nullptr;
    // Ctrl-C stops the cell in progress (its directory removed) and the suite; the output
    // files, opened empty, go too.
    tune::stop_on_signals();
    tune::BenchReport r;
    try {
      r = tune::run_bench(req, std::cerr);
    } catch (const Interrupted&) {
      std::error_code ec;
      for (const char* key : {"csv", "md"}) {
        if (in.vm.count(key)) std::filesystem::remove(in.vm[key].as<std::string>(), ec);
      }
      throw;
    }
    tune::print_bench_table(r, std::cout);
    if (csv) tune::write_bench_csv(r, *csv);
    if (md) tune::write_bench_markdown(r, *md);
    for (const auto& cell : r.cells) {
      if (cell.status == tune::CellStatus::Failed) return static_cast<int>(kExitTrainingFailed);
    }
    return static_cast<int>(kExitOk);
  };
  return c;
}

}  // namespace trainer::cli
