// `trainer help [COMMAND]` and `trainer completion bash`: generated from the command table.
#include <iostream>

#include "command.h"
#include "trainer/error.h"

namespace trainer::cli {

Command help_command() {
  Command c;
  c.name = "help";
  c.synopsis = "trainer help [COMMAND]";
  c.summary = "the commands (this text), or one command's options";
  c.run = [](const Invocation& in) -> int {
    TRAINER_CHECK_T(UsageError, in.args.size() <= 1, "one COMMAND at most");
    if (in.args.empty()) {
      std::cout << general_help();
      return static_cast<int>(kExitOk);
    }
    const Command* c = find_command(in.args[0]);
    TRAINER_CHECK_T(UsageError, c && !in.args[0].empty(), "no command '", in.args[0], "' (trainer help lists them)");
    std::cout << command_help(*c);
    return static_cast<int>(kExitOk);
  };
  return c;
}

Command completion_command() {
  Command c;
  c.name = "completion";
  c.words = "bash";
  c.synopsis = "trainer completion bash";
  c.summary = "a bash completion script: source <(trainer completion bash)";
  c.run = [](const Invocation& in) -> int {
    TRAINER_CHECK_T(UsageError, in.args.size() == 1 && in.args[0] == "bash",
                    "usage: trainer completion bash (bash is the shell it knows)");
    std::cout << bash_completion();
    return static_cast<int>(kExitOk);
  };
  return c;
}

}  // namespace trainer::cli
