#include "util/cpu_load.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace trainer::detail {

namespace {

/// "cpuN ...", not the "cpu ..." line of all CPUs together.
bool is_cpu_line(const std::string& line) {
  return line.size() > 3 && line.compare(0, 3, "cpu") == 0 && line[3] >= '0' && line[3] <= '9';
}

struct CpuLine {
  int cpu = -1;
  CpuTimes times;
};

/// One "cpuN user nice system idle iowait irq softirq steal ..." line's CPU number and times;
/// nullopt when it cannot be read.
std::optional<CpuLine> parse_cpu_line(const std::string& line) {
  std::istringstream in(line.substr(3));
  CpuLine out;
  if (!(in >> out.cpu)) return std::nullopt;
  // Older kernels give fewer columns; those missing count 0. Guest time is already inside user.
  double v[8] = {};
  int n = 0;
  while (n < 8 && in >> v[n]) ++n;
  if (n < 4) return std::nullopt;
  for (int i = 0; i < n; ++i) {
    if (!(v[i] >= 0) || !std::isfinite(v[i])) return std::nullopt;
  }
  const double idle = v[3] + v[4];  // idle, iowait
  out.times.busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  out.times.total = out.times.busy + idle;
  out.times.cpus = 1;
  return out;
}

}  // namespace

std::optional<CpuTimes> parse_proc_stat(std::string_view text, const std::vector<int>& cpus) {
  std::istringstream in{std::string(text)};
  CpuTimes sum;
  std::string line;
  while (std::getline(in, line)) {
    if (!is_cpu_line(line)) continue;
    const auto parsed = parse_cpu_line(line);
    if (!parsed) return std::nullopt;
    if (!cpus.empty() && std::find(cpus.begin(), cpus.end(), parsed->cpu) == cpus.end()) continue;
    sum.busy += parsed->times.busy;
    sum.total += parsed->times.total;
    ++sum.cpus;
  }
  if (sum.cpus == 0) return std::nullopt;
  return sum;
}

std::optional<double> other_busy(const CpuTimes& before, const CpuTimes& after, double own_cpu_s, double wall_s,
                                 int local_ranks) {
  const double busy = after.busy - before.busy, total = after.total - before.total;
  if (before.cpus != after.cpus || after.cpus <= 0 || !(total > 0) || busy < 0 || busy > total || !(wall_s > 0)) {
    return std::nullopt;
  }
  const double all_busy = busy / total * after.cpus;
  const double own = std::max(0.0, own_cpu_s) / wall_s * std::max(1, local_ranks);
  return std::max(0.0, all_busy - own);
}

ThreadChoice choose_threads(const CpuLoad& load) {
  const int cores = std::max(1, load.cores), ranks = std::max(1, load.local_ranks);
  const int share = std::max(1, cores / ranks);  // the rank's share of all cores
  const std::string of = fmt::format("{} core{}", cores, cores == 1 ? "" : "s");
  const std::string shared = ranks > 1 ? fmt::format(", shared by {} ranks", ranks) : "";
  ThreadChoice c;
  if (!load.other_busy) {
    c.threads = share;
    c.reason = fmt::format("({}{}; their load could not be read)", of, shared);
  } else {
    const double free = std::max(0.0, cores - *load.other_busy);
    c.threads = std::clamp(static_cast<int>(std::floor(free / ranks + 0.25)), 1, share);
    c.reason = fmt::format("({}, {:.1f} busy with other work{})", of, *load.other_busy, shared);
  }
  c.reason = fmt::format("{} thread{} {}", c.threads, c.threads == 1 ? "" : "s", c.reason);
  return c;
}

}  // namespace trainer::detail
