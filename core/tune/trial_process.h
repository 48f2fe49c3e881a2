#pragma once
// Private to `trainer sweep`: the processes of a study. Trials and memory estimates run as
// `trainer` processes of their own, so that what one leaves in memory is gone before the next
// starts, and a study's own process holds no model.
#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace trainer::tune {

/// Starts `args` (args[0] the executable's path) with stdout to `out` and stderr to `err` (the
/// same file when equal; this process's own when empty; each created new, whatever was at its
/// name removed first: never written through a link), and `env` added to this process's
/// environment. The child runs in a process group of its own (a Ctrl-C in the terminal reaches
/// this process alone, which forwards one SIGINT: a trainer takes a second one as "stop now"),
/// and gets SIGTERM when this process dies, so that none is left running on its own.
pid_t spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err,
            const std::vector<std::pair<std::string, std::string>>& env = {});

/// The exit code of a waitpid status: the code, or 128 + the signal that killed it.
int exit_code_of(int status);

/// The exit code of `pid` when it has ended, nullopt while it runs (reaps it).
std::optional<int> poll_exit(pid_t pid);

/// Waits for `pid` to end and returns its exit code.
int wait_exit(pid_t pid);

/// Waits for `pid` to end and returns its exit code, calling `tick` every 50 ms. An interrupt (interrupt_requested())
/// while waiting is forwarded to it once as SIGINT, and the wait goes on until it stops.
int wait_forwarding_interrupt(pid_t pid, const std::function<void()>& tick = {});

/// Whether process `pid` is alive and its command line contains `needle` (a pid read back from
/// a journal: the process may be gone, or the number taken by another process).
bool process_running(pid_t pid, const std::string& needle);

/// A whole text file ("" when it cannot be read).
std::string read_text(const std::string& path);

/// The last `n` non-empty lines of a text file, joined with " | ".
std::string last_lines(const std::string& path, std::size_t n);

}  // namespace trainer::tune
