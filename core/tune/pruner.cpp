#include "pruner.h"

#include <algorithm>
#include <sstream>
#include <vector>

namespace trainer::tune {

std::string prune_reason(const SweepSettings& s, const TrialRecord& t,
                         const std::map<std::int64_t, TrialRecord>& trials) {
  if (t.intermediate.empty()) return {};
  const std::size_t k = t.intermediate.size() - 1;
  // Smaller is better below, whatever the direction.
  const auto loss_of = [&](double v) { return s.direction == "maximize" ? -v : v; };
  const double mine = loss_of(t.intermediate[k]);
  std::vector<double> others;
  std::ostringstream why;
  if (s.pruner == "median") {
    if (static_cast<std::int64_t>(k + 1) < s.pruner_warmup) return {};
    for (const auto& [n, o] : trials) {
      if (n != t.number && o.state == TrialState::Complete && o.intermediate.size() > k)
        others.push_back(loss_of(o.intermediate[k]));
    }
    if (static_cast<std::int64_t>(others.size()) < s.pruner_min_trials) return {};
    std::sort(others.begin(), others.end());
    const std::size_t m = others.size();
    const double median = m % 2 ? others[m / 2] : 0.5 * (others[m / 2 - 1] + others[m / 2]);
    if (mine <= median) return {};
    why << "median: " << s.objective << " " << t.intermediate[k] << " at report " << (k + 1)
        << " is worse than the median " << (s.direction == "maximize" ? -median : median) << " of " << m
        << " completed trials";
    return why.str();
  }
  if (s.pruner == "successive_halving") {
    std::int64_t rung = s.min_resource;
    while (rung < static_cast<std::int64_t>(k + 1)) rung *= s.reduction_factor;
    if (rung != static_cast<std::int64_t>(k + 1)) return {};
    others.push_back(mine);
    for (const auto& [n, o] : trials) {
      if (n != t.number && o.intermediate.size() > k) others.push_back(loss_of(o.intermediate[k]));
    }
    std::sort(others.begin(), others.end());
    const auto keep = std::max<std::size_t>(1, others.size() / static_cast<std::size_t>(s.reduction_factor));
    if (mine <= others[keep - 1]) return {};
    why << "successive halving: " << s.objective << " " << t.intermediate[k] << " at report " << (k + 1)
        << " is not in the best " << keep << " of " << others.size() << " trials at that rung";
    return why.str();
  }
  return {};
}

}  // namespace trainer::tune
