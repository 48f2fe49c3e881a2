// `trainer mlflow sync RUN_DIR ...`: what a run's MLflow journal holds that the server lacks.
#include <iostream>

#include "command.h"
#include "mlflow_export.h"
#include "trainer/error.h"

namespace trainer::cli {

Command mlflow_command() {
  Command c;
  c.name = "mlflow";
  c.words = "sync";
  c.synopsis = "trainer mlflow sync RUN_DIR [PREVIOUS_RUN_DIR...] [--tracking-uri URI]";
  c.summary =
      "send what the run's MLflow journal holds that the server\n"
      "has not acknowledged (default: $MLFLOW_TRACKING_URI, else\n"
      "the server the run used); a run whose process died is\n"
      "marked FAILED; PREVIOUS_RUN_DIR: the run it resumed";
  c.options = [](po::options_description& d) {
    d.add_options()("tracking-uri", po::value<std::string>(), "the MLflow server to send to");
  };
  c.run = [](const Invocation& in) -> int {
    TRAINER_CHECK_T(UsageError, in.args.size() >= 2 && in.args[0] == "sync",
                    "usage: trainer mlflow sync RUN_DIR [PREVIOUS_RUN_DIR...] [--tracking-uri URI]");
    return mlflow::sync_run_dir(in.args[1], in.vm.count("tracking-uri") ? in.vm["tracking-uri"].as<std::string>() : "",
                                std::cout, std::cerr, {in.args.begin() + 2, in.args.end()});
  };
  return c;
}

}  // namespace trainer::cli
