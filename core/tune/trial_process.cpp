#include "trial_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "trainer/durable_file.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"

namespace trainer::tune {

pid_t spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err,
            const std::vector<std::pair<std::string, std::string>>& env) {
  TRAINER_CHECK(!args.empty(), "spawn: no command");
  // Everything the child needs is made before fork: between fork and exec only
  // async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    const bool replaced =
        std::any_of(env.begin(), env.end(), [&](const auto& kv) { return v.rfind(kv.first + "=", 0) == 0; });
    if (!replaced) env_text.push_back(v);
  }
  for (const auto& [k, v] : env) env_text.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  // The output files are created new before fork (a trial's .out in a study directory from
  // elsewhere may be a planted link: never written through); the child gets the descriptors.
  const bool same = err == out;
  const FileDescriptor out_fd = out.empty() ? FileDescriptor() : create_new_file(out);
  const FileDescriptor err_fd = err.empty() || same ? FileDescriptor() : create_new_file(err);
  const int o = out_fd.get(), e = same ? o : err_fd.get();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  TRAINER_CHECK(pid >= 0, "cannot start ", args[0], ": fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(143);  // the study died before prctl took effect
    ::setpgid(0, 0);
    if (o >= 0) ::dup2(o, 1);
    if (e >= 0) ::dup2(e, 2);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

std::optional<int> poll_exit(pid_t pid) {
  int status = 0;
  pid_t w;
  while ((w = ::waitpid(pid, &status, WNOHANG)) < 0 && errno == EINTR) {
  }
  if (w == pid) return exit_code_of(status);
  TRAINER_CHECK(w == 0, "waitpid(", pid, ") failed: the child is gone");
  return std::nullopt;
}

int wait_exit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    TRAINER_CHECK(errno == EINTR, "waitpid(", pid, ") failed: the child is gone");
  }
  return exit_code_of(status);
}

int wait_forwarding_interrupt(pid_t pid, const std::function<void()>& tick) {
  bool forwarded = false;
  for (;;) {
    if (const auto rc = poll_exit(pid)) return *rc;
    if (tick) tick();
    if (interrupt_requested() && !forwarded) {
      ::kill(pid, SIGINT);
      forwarded = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool process_running(pid_t pid, const std::string& needle) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::string cmdline = read_text("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& c : cmdline) {
    if (c == '\0') c = ' ';
  }
  return cmdline.find(needle) != std::string::npos;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string last_lines(const std::string& path, std::size_t n) {
  std::vector<std::string> lines;
  std::istringstream in(read_text(path));
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) lines.push_back(l);
  }
  std::string out;
  for (std::size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i)
    out += (out.empty() ? "" : " | ") + lines[i];
  return out;
}

}  // namespace trainer::tune
