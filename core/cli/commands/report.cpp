// `trainer report RUN_DIR... [-o FILE]`: the run as one self-contained HTML page; several runs
// overlaid on one.
#include <iostream>

#include "command.h"
#include "report.h"
#include "trainer/error.h"

namespace trainer::cli {

Command report_command() {
  Command c;
  c.name = "report";
  c.synopsis = "trainer report RUN_DIR... [-o FILE]";
  c.summary =
      "one self-contained HTML page of the run: loss, accuracy,\n"
      "learning rate, throughput, memory with out-of-memory\n"
      "errors, the config (default FILE: RUN_DIR/report.html);\n"
      "several runs: overlaid, with the config keys that differ\n"
      "(default FILE: compare.html beside the first)";
  c.options = [](po::options_description& d) {
    d.add_options()("output,o", po::value<std::string>(), "the HTML file to write");
  };
  c.run = [](const Invocation& in) -> int {
    TRAINER_CHECK_T(UsageError, !in.args.empty(), "usage: trainer report RUN_DIR... [-o FILE]");
    std::string written;
    const std::string out = in.vm.count("output") ? in.vm["output"].as<std::string>() : "";
    const int rc = in.args.size() == 1 ? report::write_report(in.args[0], out, std::cerr, &written)
                                       : report::write_comparison(in.args, out, std::cerr, &written);
    if (rc == 0) std::cout << "trainer report: wrote " << written << "\n";
    return rc;
  };
  return c;
}

}  // namespace trainer::cli
