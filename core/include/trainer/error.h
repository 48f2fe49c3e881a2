#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainer/export.h"
#include "trainer/states.h"

namespace trainer {

/// Process exit codes of the `trainer` executable (documented in docs/recipes.md).
enum ExitCode : int {
  kExitOk = 0,              ///< training finished
  kExitUsage = 2,           ///< bad command line, recipe or config
  kExitTrainingFailed = 3,  ///< training started but failed (run status FAILED)
  kExitNoDevice = 4,        ///< no device could be had (device_select: no GPU, no CPU fallback)
  kExitInterrupted = 130,   ///< SIGINT/SIGTERM: stopped at a safe point (checkpoint if checkpoint.at_end)
};

/// Base of every exception trainer throws.
class TRAINER_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad command line or usage (exit code 2).
class TRAINER_API UsageError : public Error {
 public:
  using Error::Error;
};

/// One or more config problems, all collected before throwing (exit code 2).
/// Each problem names its origin (`file:line` or the override) and what is allowed.
class TRAINER_API ConfigError : public UsageError {
 public:
  explicit ConfigError(std::vector<std::string> problems);
  const std::vector<std::string>& problems() const noexcept { return problems_; }

 private:
  std::vector<std::string> problems_;
};

/// A plugin could not be found or loaded, was refused (ABI), or an essential plugin threw.
class TRAINER_API PluginError : public Error {
 public:
  using Error::Error;
};

/// SIGINT/SIGTERM answered in a long phase outside the training step (a dataset scan, feature
/// caching, an estimate's probes): the run ends KILLED with exit code 130 and leaves nothing
/// half-made (no checkpoint when no step was trained). Thrown by throw_if_interrupted().
class TRAINER_API Interrupted : public Error {
 public:
  using Error::Error;
};

/// Ends the run with a given exit code and status. The event bus passes it through
/// unchanged whatever the plugin's policy, so a plugin can end the run the way it means:
/// device_select throws it with kExitNoDevice when no device can be had.
class TRAINER_API ExitRequest : public Error {
 public:
  ExitRequest(int exit_code, RunStatus status, const std::string& message)
      : Error(message), exit_code_(exit_code), status_(status) {}
  int exit_code() const noexcept { return exit_code_; }
  RunStatus status() const noexcept { return status_; }  ///< Failed or Killed

 private:
  int exit_code_;
  RunStatus status_;
};

namespace detail {
/// The parts of the check macros below, streamed together. The macros take parts, not a format
/// string, so that a plugin can hand them LibTorch's values (devices, shapes, dtypes), which
/// print through operator<<; trainer's own messages are built with fmt::format.
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] TRAINER_API void assert_fail(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace trainer

/// Throws trainer::Error with the parts streamed together when `cond` is false.
#define TRAINER_CHECK(cond, ...)                                              \
  do {                                                                        \
    if (!(cond)) throw ::trainer::Error(::trainer::detail::str(__VA_ARGS__)); \
  } while (0)

/// Like TRAINER_CHECK but throws the given trainer exception type.
#define TRAINER_CHECK_T(type, cond, ...)                          \
  do {                                                            \
    if (!(cond)) throw type(::trainer::detail::str(__VA_ARGS__)); \
  } while (0)

/// Internal invariant: a failure is a bug in trainer, not a user error.
#define TRAINER_ASSERT(cond, ...)                                                            \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::trainer::detail::assert_fail(#cond, __FILE__, __LINE__,                              \
                                     ::trainer::detail::str("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
