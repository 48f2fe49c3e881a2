// The `trainer` command: finds the subcommand in the table (command.h), parses its options
// alone, runs it, and maps what it throws to an exit code (trainer/exit_status.h).
// Exit codes: 0 ok, 2 usage/config error, 3 training failed, 4 no device, 130 interrupted.
#include <unistd.h>

#include <iostream>

#include "command.h"
#include "trainer/devices.h"
#include "trainer/error.h"
#include "trainer/exit_status.h"

namespace {

using trainer::cli::Command;
using trainer::cli::po::options_description;

std::string this_executable() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string();
}

/// `trainer NAME ...` runs the command NAME; anything else (`trainer --recipe FILE ...`) trains.
/// `trainer --help` is the general help; `trainer COMMAND --help` the command's.
int run(const Command& c, const std::vector<std::string>& argv) {
  namespace po = trainer::cli::po;
  if (c.run_raw) {
    if (!argv.empty() && (argv.front() == "--help" || argv.front() == "-h")) {
      std::cout << trainer::cli::command_help(c);
      return trainer::kExitOk;
    }
    const std::string self = this_executable();
    TRAINER_CHECK(!self.empty(), "cannot find this executable (/proc/self/exe)");
    return c.run_raw(argv, self);
  }
  const options_description own = trainer::cli::options_of(c);
  options_description all;
  all.add(own);
  all.add_options()("args", po::value<std::vector<std::string>>(), "");
  po::positional_options_description pos;
  pos.add("args", -1);
  trainer::cli::Invocation in;
  try {
    po::store(po::command_line_parser(argv).options(all).positional(pos).run(), in.vm);
    po::notify(in.vm);
  } catch (const po::error& e) {
    throw trainer::UsageError(std::string(e.what()) + " (trainer help " + (c.name.empty() ? "" : c.name + " ") +
                              "lists the options)");
  }
  if (in.vm.count("help")) {
    std::cout << (c.name.empty() ? trainer::cli::general_help() : trainer::cli::command_help(c));
    return trainer::kExitOk;
  }
  if (in.vm.count("args")) in.args = in.vm["args"].as<std::vector<std::string>>();
  if (in.vm.count("plugin-dir")) in.plugin_dirs = in.vm["plugin-dir"].as<std::vector<std::string>>();
  in.self = this_executable();
  return c.run(in);
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything can start CUDA: number GPUs in PCI-bus order, as NVML does.
  const std::string order_warning = trainer::prefer_pci_bus_order();
  if (!order_warning.empty()) std::cerr << "trainer: warning: " << order_warning << "\n";
  const std::vector<std::string> args(argv + 1, argv + argc);
  const Command* sub = args.empty() || args.front().empty() ? nullptr : trainer::cli::find_command(args.front());
  const Command& command = sub ? *sub : *trainer::cli::find_command("");
  const std::string who = command.name.empty() ? "trainer: " : "trainer " + command.name + ": ";
  try {
    return run(command, sub ? std::vector<std::string>(args.begin() + 1, args.end()) : args);
  } catch (const trainer::ConfigError& e) {
    std::cerr << who << e.problems().size() << " config error" << (e.problems().size() == 1 ? "" : "s") << ":\n";
    for (const auto& p : e.problems()) std::cerr << "  " << p << "\n";
    return trainer::kExitUsage;
  } catch (const std::exception& e) {
    const std::string message = e.what();
    std::cerr << (message.rfind(who, 0) == 0 ? "" : who) << message << "\n";  // launch names itself
    return trainer::exit_status_of(e, /*during_run=*/false).exit_code;
  }
}
