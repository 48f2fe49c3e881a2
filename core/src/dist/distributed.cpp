#include "trainer/distributed.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <utility>

#include "trainer/error.h"

namespace trainer {

namespace {

/// A variable's value, or nullopt when unset or empty.
std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// An integer variable in [low, high]; appends a problem when it is not one.
std::int64_t env_int(const char* name, std::int64_t low, std::int64_t high, std::vector<std::string>& problems) {
  const auto v = env_value(name);
  if (!v) {
    problems.push_back(fmt::format("{} is not set", name));
    return low;
  }
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (errno != 0 || end == v->c_str() || *end != '\0' || x < low || x > high) {
    problems.push_back(fmt::format("{}={}: expected an integer in [{}, {}]", name, *v, low, high));
    return low;
  }
  return x;
}

}  // namespace

/// A number torchrun sets (RANK, LOCAL_RANK) in a data-parallel launch (WORLD_SIZE > 1), else
/// `otherwise`. Never throws: the trainer checks the variables when it starts.
static std::int64_t launch_value(const char* name, std::int64_t otherwise) {
  const auto world = env_value("WORLD_SIZE");
  const auto value = env_value(name);
  if (!world || *world == "1" || !value) return otherwise;
  return std::strtoll(value->c_str(), nullptr, 10);
}

std::int64_t rank_of_this_process() { return launch_value("RANK", 0); }

std::int64_t local_rank_of_this_process() { return launch_value("LOCAL_RANK", -1); }

std::string physical_gpu(const c10::Device& device) {
  if (!device.is_cuda()) return "cpu";
  const std::int64_t index = device.has_index() ? device.index() : 0;
  if (const auto visible = env_value("CUDA_VISIBLE_DEVICES")) {
    std::vector<std::string> entries;
    std::string entry;
    for (char c : *visible + ",") {
      if (c == ',') {
        entries.push_back(entry);
        entry.clear();
      } else if (c != ' ') {
        entry += c;
      }
    }
    if (index < static_cast<std::int64_t>(entries.size())) return entries[static_cast<std::size_t>(index)];
  }
  return "cuda:" + std::to_string(index);
}

std::string shared_gpu(const std::vector<std::string>& places) {
  for (std::size_t a = 0; a < places.size(); ++a) {
    const auto space = places[a].rfind(' ');
    if (space == std::string::npos || places[a].substr(space + 1) == "cpu") continue;
    for (std::size_t b = a + 1; b < places.size(); ++b) {
      if (places[b] == places[a]) {
        const std::string gpu = places[a].substr(space + 1);
        return fmt::format("ranks {} and {} both use {}{} on host {}", a, b, gpu.rfind("cuda:", 0) == 0 ? "" : "GPU ",
                           gpu, places[a].substr(0, space));
      }
    }
  }
  return "";
}

DistEnv DistEnv::from_env() {
  DistEnv env;
  const auto world = env_value("WORLD_SIZE");
  if (!world || *world == "1") {
    // torchrun with one process, or no launcher: a run of one. A RANK without WORLD_SIZE is a
    // mistake, not a run of one.
    TRAINER_CHECK_T(UsageError, world || !env_value("RANK"),
                    "RANK is set but WORLD_SIZE is not: a data-parallel launch sets both (torchrun, trainer launch)");
    return env;
  }
  std::vector<std::string> problems;
  env.world_size = env_int("WORLD_SIZE", 1, 1 << 20, problems);
  env.rank = env_int("RANK", 0, env.world_size - 1, problems);
  env.local_world_size = env_int("LOCAL_WORLD_SIZE", 1, env.world_size, problems);
  env.local_rank = env_int("LOCAL_RANK", 0, env.local_world_size - 1, problems);
  env.master_port = env_int("MASTER_PORT", 1, 65535, problems);
  if (const auto a = env_value("MASTER_ADDR")) {
    env.master_addr = *a;
  } else {
    problems.push_back("MASTER_ADDR is not set");
  }
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    throw UsageError("a data-parallel launch (WORLD_SIZE=" + *world + ") needs RANK, WORLD_SIZE, LOCAL_RANK, " +
                     "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT: " + all);
  }
  return env;
}

namespace {

/// Whether a listening socket could take `port` on every address now, as the group's store
/// does (SO_REUSEADDR: a port left in TIME_WAIT by an ended run is free to it).
bool port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0;
  ::close(fd);
  return ok;
}

/// The kernel's range for the local ports of outgoing connections
/// (/proc/sys/net/ipv4/ip_local_port_range), Linux's default when it cannot be read.
std::pair<int, int> ephemeral_ports() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (in >> low >> high && low >= 1 && low <= high && high <= 65535) return {low, high};
  return {32768, 60999};
}

}  // namespace

int free_loopback_port() {
  // A port the kernel hands out (bind to port 0) is one of the ephemeral range, which every
  // outgoing connection on the host also draws from: between this check and rank 0's bind, a
  // connection of another run (its Gloo pairs, its store clients) may take it. Below that
  // range no connection takes a port by itself, so a random one there that is free now stays
  // free unless another process binds it on purpose.
  const auto [low, high] = ephemeral_ports();
  std::random_device device;
  std::mt19937 pick(device() ^ static_cast<std::uint32_t>(::getpid()));
  const int first = std::max(1024, low - 10000), last = low - 1;
  if (last - first >= 1000) {
    std::uniform_int_distribution<int> port(first, last);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int p = port(pick);
      if (port_is_free(p)) return p;
    }
  }
  // A host whose ephemeral range leaves no room below it: the first free port above it, else
  // the kernel's pick.
  for (int p = high + 1; p <= 65535; ++p) {
    if (port_is_free(p)) return p;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TRAINER_CHECK(fd >= 0, "no socket to find a free port on 127.0.0.1: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  TRAINER_CHECK(ok, "cannot find a free port on 127.0.0.1 (none free in ", first, "..", last, " nor above ", high,
                "); set MASTER_PORT");
  return ntohs(a.sin_port);
}

}  // namespace trainer
