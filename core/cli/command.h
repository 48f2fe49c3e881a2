#pragma once
// The `trainer` command as a table: each subcommand is one Command (its name, synopsis, what
// it does, its own options and how it runs), defined in a file of its own under commands/.
// main.cpp finds the command, parses its options alone, runs it and maps what it throws to
// an exit code; the general help, `trainer help COMMAND` and the bash completion are
// generated from the table.
#include <boost/program_options.hpp>

#include <functional>
#include <string>
#include <vector>

namespace trainer::cli {

namespace po = boost::program_options;

/// What a command runs with: its parsed options, the positional arguments after its name
/// (overrides, run directories) and the plugin directories given with --plugin-dir.
struct Invocation {
  po::variables_map vm;
  std::vector<std::string> args;
  std::vector<std::string> plugin_dirs;
  /// This executable (/proc/self/exe), for commands that start trainer processes.
  std::string self;
};

struct Command {
  std::string name;      ///< "estimate"; "" for training (`trainer --recipe FILE`)
  std::string synopsis;  ///< "trainer estimate --recipe FILE [OVERRIDE...] ..."
  std::string summary;   ///< what it does, a few lines
  std::string words;     ///< fixed words it takes after its name ("sync"), offered by the completion
  /// Declares the command's options (besides --help, which every command has).
  std::function<void(po::options_description&)> options;
  /// Runs it; returns the exit code (what it throws is mapped by main.cpp).
  std::function<int(const Invocation&)> run;
  /// Takes its arguments unparsed (`trainer launch`, whose arguments after -- are the ranks'):
  /// run_raw instead of options and run.
  std::function<int(const std::vector<std::string>&, const std::string& self)> run_raw;
};

/// Every command, training first, in the order the help lists them.
const std::vector<Command>& commands();
/// The command named `name`; null when there is none ("" is training).
const Command* find_command(const std::string& name);

/// The command's options, --help included.
po::options_description options_of(const Command& c);
/// `trainer help COMMAND`, `trainer COMMAND --help`: synopsis, summary, options.
std::string command_help(const Command& c);
/// `trainer --help`: every command's synopsis and summary, the override syntax, exit codes.
std::string general_help();
/// `trainer completion bash`: a bash completion script for the command names and each
/// command's options (files complete where no option matches).
std::string bash_completion();

// The commands, one file each under commands/.
Command train_command();
Command plugins_command();
Command mem_command();
Command estimate_command();
Command bench_command();
Command lr_find_command();
Command launch_command();
Command sweep_command();
Command report_command();
Command mlflow_command();
Command help_command();
Command completion_command();

}  // namespace trainer::cli
