// `trainer launch --nproc N -- --recipe FILE [OVERRIDE...]`: a data-parallel run of N local
// processes. Its arguments after -- are the ranks', so the command takes them unparsed.
#include "launch.h"
#include "command.h"

namespace trainer::cli {

Command launch_command() {
  Command c;
  c.name = "launch";
  c.synopsis = "trainer launch --nproc N -- --recipe FILE [OVERRIDE...]";
  c.summary =
      "a data-parallel run of N local processes (torchrun's\n"
      "variables, Gloo over 127.0.0.1); docs/distributed.md";
  c.run_raw = [](const std::vector<std::string>& args, const std::string& self) { return launch(self, args); };
  return c;
}

}  // namespace trainer::cli
