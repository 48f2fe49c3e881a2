#pragma once
// Runs a piece of a test in a forked child whose memory and time are bounded: a reader that would
// allocate what a hostile file declares, or loop for ever, runs out there (or is stopped) instead
// of taking the machine's memory or hanging the test. Standard library and POSIX only.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <new>
#include <string>

namespace trainer::testing {

/// How a bounded child ended.
struct BoundedChild {
  int code = -1;     ///< its exit code (0, 3 out of memory, 4 another exception), or 128 + a signal
  std::string text;  ///< what the body returned, or what ended it
};

/// Runs `body` in a child process that may map at most `extra_bytes` more than this process has
/// mapped and is killed after `seconds` (SIGALRM). A std::bad_alloc ends it with code 3 and
/// "out of memory (more than the limit allocated)", another exception with code 4 and "another
/// exception: <what>"; a signal adds " (the child was killed by signal N)" to what it said.
inline BoundedChild run_bounded(const std::function<std::string()>& body, unsigned seconds = 60,
                                std::uint64_t extra_bytes = std::uint64_t(1) << 30) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, "pipe failed"};
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    long pages = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const rlim_t limit = rlim_t(pages) * rlim_t(::sysconf(_SC_PAGESIZE)) + extra_bytes;
    const rlimit rl{limit, limit};
    ::setrlimit(RLIMIT_AS, &rl);
    ::alarm(seconds);
    std::string text;
    int code = 0;
    try {
      text = body();
    } catch (const std::bad_alloc&) {
      text = "out of memory (more than the limit allocated)", code = 3;
    } catch (const std::exception& e) {
      text = std::string("another exception: ") + e.what(), code = 4;
    }
    for (std::size_t at = 0; at < text.size();) {
      const ssize_t n = ::write(fds[1], text.data() + at, text.size() - at);
      if (n <= 0) break;
      at += std::size_t(n);
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  BoundedChild child;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) child.text.append(buf, std::size_t(n));
  ::close(fds[0]);
  int status = 0;
  if (pid > 0 && ::waitpid(pid, &status, 0) == pid) {
    child.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (WIFSIGNALED(status)) child.text += " (the child was killed by signal " + std::to_string(WTERMSIG(status)) + ")";
  }
  return child;
}

}  // namespace trainer::testing
