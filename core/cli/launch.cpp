#include "launch.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <random>
#include <thread>

#include "trainer/distributed.h"
#include "trainer/error.h"
#include "trial_process.h"

namespace trainer::cli {
namespace {

volatile std::sig_atomic_t g_signals = 0;      ///< signals received
volatile std::sig_atomic_t g_last_signal = 0;  ///< the last one

extern "C" void on_launch_signal(int sig) {
  g_last_signal = sig;
  g_signals = g_signals + 1;
}

}  // namespace

int launch(const std::string& self, const std::vector<std::string>& args) {
  std::int64_t nproc = 0;
  std::size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    std::string value;
    if (args[i] == "--nproc" && i + 1 < args.size()) {
      value = args[++i];
    } else if (args[i].rfind("--nproc=", 0) == 0) {
      value = args[i].substr(8);
    } else {
      throw UsageError("trainer launch: unexpected '" + args[i] +
                       "'; usage: trainer launch --nproc N -- <trainer args>");
    }
    char* end = nullptr;
    nproc = std::strtoll(value.c_str(), &end, 10);
    TRAINER_CHECK_T(UsageError, !value.empty() && *end == '\0' && nproc >= 1 && nproc <= 1024,
                    "trainer launch: --nproc '", value, "': expected a number of processes from 1 to 1024");
  }
  TRAINER_CHECK_T(UsageError, nproc >= 1,
                  "trainer launch: --nproc N is required: trainer launch --nproc N -- <trainer args>");
  TRAINER_CHECK_T(UsageError, i < args.size() && i + 1 < args.size(),
                  "trainer launch: the trainer's arguments follow '--': trainer launch --nproc ", nproc,
                  " -- --recipe FILE [OVERRIDE...]");
  const char* port_env = std::getenv("MASTER_PORT");
  const std::string port =
      port_env && *port_env ? std::string(port_env) : std::to_string(trainer::free_loopback_port());
  // The group's own keys in its store: a rank of another group that reaches this store (the
  // port reused) joins nothing of this one.
  std::random_device device;
  const std::string group = fmt::format("{:08x}{:08x}", device(), device() ^ static_cast<unsigned>(::getpid()));
  std::vector<std::string> command{self};
  command.insert(command.end(), args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());

  std::signal(SIGINT, on_launch_signal);
  std::signal(SIGTERM, on_launch_signal);
  std::vector<pid_t> ranks;
  for (std::int64_t r = 0; r < nproc; ++r) {
    ranks.push_back(tune::spawn(command, "", "",
                                {{"RANK", std::to_string(r)},
                                 {"WORLD_SIZE", std::to_string(nproc)},
                                 {"LOCAL_RANK", std::to_string(r)},
                                 {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", port},
                                 {"TRAINER_GROUP_ID", group}}));
  }
  std::cerr << "trainer launch: " << nproc << " processes, 127.0.0.1:" << port << "\n";
  std::vector<int> codes(ranks.size(), -1);
  std::size_t left = ranks.size();
  int first_failure = 0;
  bool stopping = false;
  std::sig_atomic_t forwarded = 0;
  std::chrono::steady_clock::time_point stop_sent;
  while (left > 0) {
    if (g_signals != forwarded) {
      // Each signal once to each rank: the first stops them at their next safe point with a
      // checkpoint, a second one stops them now.
      forwarded = g_signals;
      for (std::size_t r = 0; r < ranks.size(); ++r) {
        if (codes[r] < 0) ::kill(ranks[r], g_last_signal);
      }
    }
    if (stopping && std::chrono::steady_clock::now() - stop_sent > std::chrono::seconds(10)) {
      // A rank still waiting for the one that failed (forming the group, in a collective) would
      // wait out the whole timeout.
      for (std::size_t r = 0; r < ranks.size(); ++r) {
        if (codes[r] < 0) ::kill(ranks[r], SIGKILL);
      }
      stopping = false;
    }
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      if (codes[r] >= 0) continue;
      const auto rc = tune::poll_exit(ranks[r]);
      if (!rc) continue;
      codes[r] = *rc;
      --left;
      if (*rc != 0 && first_failure == 0) {
        first_failure = *rc;
        if (forwarded == 0 && left > 0) {
          std::cerr << "trainer launch: rank " << r << " exited with " << *rc << "; stopping the others\n";
          for (std::size_t o = 0; o < ranks.size(); ++o) {
            if (codes[o] < 0) ::kill(ranks[o], SIGTERM);
          }
          stopping = true;
          stop_sent = std::chrono::steady_clock::now();
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return first_failure;
}

}  // namespace trainer::cli
