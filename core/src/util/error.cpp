#include "trainer/error.h"

namespace trainer {

namespace {
std::string join_problems(const std::vector<std::string>& problems) {
  std::string s = problems.size() == 1 ? "config error: " : std::to_string(problems.size()) + " config errors:";
  for (const auto& p : problems) s += (problems.size() == 1 ? "" : "\n  ") + p;
  return s;
}
}  // namespace

ConfigError::ConfigError(std::vector<std::string> problems)
    : UsageError(join_problems(problems)), problems_(std::move(problems)) {}

namespace detail {
void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  throw Error(
      str("internal error (a trainer bug): ", cond, " failed at ", file, ":", line, msg.empty() ? "" : ": ", msg));
}
}  // namespace detail

}  // namespace trainer
