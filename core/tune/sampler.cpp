#include "sampler.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>

#include "trainer/error.h"

namespace trainer::tune {
namespace {

using Kind = SearchParam::Kind;

/// The bounds of `p` in internal units for range `r` (int: widened by half a step each side so
/// that every grid value owns an equal interval; log_uniform: natural log).
std::pair<double, double> bounds(const SearchParam& p, const ParamRange& r) {
  switch (p.kind) {
    case Kind::Choice:
      return {0.0, double(r.values.size()) - 1.0};
    case Kind::Int:
      return {r.low - 0.5 * double(r.step), r.high + 0.5 * double(r.step)};
    case Kind::Uniform:
      return {r.low, r.high};
    case Kind::LogUniform:
      return {std::log(r.low), std::log(r.high)};
  }
  return {0.0, 0.0};
}

/// The value text `key` took among the internal values chosen so far ("" when not chosen); a
/// choice that is itself conditional is read in its own case's values.
std::string value_text(const SearchSpace& space, const std::string& key, const std::map<std::string, double>& chosen) {
  for (const auto& q : space.params()) {
    if (q.key != key) continue;
    const auto it = chosen.find(q.key);
    if (it == chosen.end() || q.kind != Kind::Choice) return {};
    const ParamRange& r =
        q.range_for(q.condition_on.empty() ? std::string() : value_text(space, q.condition_on, chosen));
    const auto i = static_cast<std::size_t>(
        std::clamp<long long>(std::llround(it->second), 0, static_cast<long long>(r.values.size()) - 1));
    return r.values[i];
  }
  return {};
}

/// The parent's value text for a conditional parameter, from the internal values chosen so far.
std::string parent_value(const SearchSpace& space, const SearchParam& p, const std::map<std::string, double>& chosen) {
  return p.condition_on.empty() ? std::string() : value_text(space, p.condition_on, chosen);
}

double draw_uniform(const SearchParam& p, const ParamRange& r, std::mt19937_64& rng) {
  if (p.kind == Kind::Choice) {
    return double(std::uniform_int_distribution<std::int64_t>(0, std::int64_t(r.values.size()) - 1)(rng));
  }
  if (p.kind == Kind::Int) {
    const auto n = static_cast<std::int64_t>((r.high - r.low) / double(r.step));
    return r.low + double(std::uniform_int_distribution<std::int64_t>(0, n)(rng) * r.step);
  }
  const auto [lo, hi] = bounds(p, r);
  return lo == hi ? lo : std::uniform_real_distribution<double>(lo, hi)(rng);
}

class GridSampler final : public Sampler {
 public:
  Assignment sample(const SearchSpace& space, std::int64_t number, const std::vector<Observation>&,
                    std::mt19937_64&) override {
    const std::int64_t n = space.grid_size();
    TRAINER_CHECK_T(UsageError, n > 0,
                    "sampler \"grid\" needs every parameter to be a choice or an int range (uniform and log_uniform "
                    "have no grid); use \"random\" or \"tpe\"");
    return space.grid_point(number % n);
  }
};

class RandomSampler final : public Sampler {
 public:
  Assignment sample(const SearchSpace& space, std::int64_t, const std::vector<Observation>&,
                    std::mt19937_64& rng) override {
    std::map<std::string, double> chosen;
    for (const auto& p : space.params())
      chosen[p.key] = draw_uniform(p, p.range_for(parent_value(space, p, chosen)), rng);
    return space.make(chosen);
  }
};

/// A Parzen estimator over one numeric parameter: Gaussians at the observations plus a wide
/// prior at the range's centre, each truncated to the range.
struct Parzen {
  std::vector<double> mu, sigma, weight;
  double lo = 0, hi = 0;

  Parzen(const std::vector<double>& xs, double lo_, double hi_, double prior_weight) : lo(lo_), hi(hi_) {
    const double width = std::max(hi - lo, 1e-12);
    // Each observation's bandwidth is its larger gap to a neighbour, the prior's centre and
    // the bounds counting as neighbours (Optuna's rule), clipped to [width / min(100, 1 + n), width].
    std::vector<double> sorted = xs;
    sorted.push_back(0.5 * (lo + hi));
    std::sort(sorted.begin(), sorted.end());
    const double min_sigma = width / std::min(100.0, 1.0 + double(xs.size()));
    for (double x : xs) {
      const auto i = static_cast<std::size_t>(std::lower_bound(sorted.begin(), sorted.end(), x) - sorted.begin());
      const double left = x - (i == 0 ? lo : sorted[i - 1]);
      const double right = (i + 1 >= sorted.size() ? hi : sorted[i + 1]) - x;
      mu.push_back(x);
      sigma.push_back(std::clamp(std::max(left, right), min_sigma, width));
      weight.push_back(1.0);
    }
    mu.push_back(0.5 * (lo + hi));
    sigma.push_back(width);
    weight.push_back(prior_weight);
    double total = 0;
    for (double w : weight) total += w;
    for (double& w : weight) w /= total;
  }

  static double cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

  double log_density(double x) const {
    double p = 0;
    for (std::size_t i = 0; i < mu.size(); ++i) {
      const double z = (x - mu[i]) / sigma[i];
      const double mass = std::max(cdf((hi - mu[i]) / sigma[i]) - cdf((lo - mu[i]) / sigma[i]), 1e-12);
      p += weight[i] * std::exp(-0.5 * z * z) / (sigma[i] * std::sqrt(2.0 * M_PI) * mass);
    }
    return std::log(std::max(p, 1e-300));
  }

  double draw(std::mt19937_64& rng) const {
    const std::size_t i = std::discrete_distribution<std::size_t>(weight.begin(), weight.end())(rng);
    std::normal_distribution<double> n(mu[i], sigma[i]);
    for (int tries = 0; tries < 100; ++tries) {
      const double x = n(rng);
      if (x >= lo && x <= hi) return x;
    }
    return std::clamp(mu[i], lo, hi);
  }
};

/// Category probabilities: the prior spread evenly plus one per observation.
std::vector<double> category_probabilities(const std::vector<double>& xs, std::size_t k, double prior_weight) {
  std::vector<double> p(k, prior_weight / double(k));
  for (double x : xs) p[std::size_t(std::clamp<long long>(std::llround(x), 0, (long long)k - 1))] += 1.0;
  double total = 0;
  for (double v : p) total += v;
  for (double& v : p) v /= total;
  return p;
}

class TpeSampler final : public Sampler {
 public:
  explicit TpeSampler(TpeSettings s) : s_(s) {}

  Assignment sample(const SearchSpace& space, std::int64_t, const std::vector<Observation>& history,
                    std::mt19937_64& rng) override {
    std::map<std::string, double> chosen;
    const bool startup = static_cast<std::int64_t>(history.size()) < s_.startup;
    for (const auto& p : space.params()) {
      const std::string parent = parent_value(space, p, chosen);
      const ParamRange& r = p.range_for(parent);
      if (startup) {
        chosen[p.key] = draw_uniform(p, r, rng);
        continue;
      }
      // The finished trials that had this parameter in this case, best first.
      std::vector<const Observation*> relevant;
      for (const auto& o : history) {
        if (!o.internal.count(p.key)) continue;
        if (!p.condition_on.empty()) {
          if (!o.internal.count(p.condition_on) || parent_value(space, p, o.internal) != parent) continue;
        }
        relevant.push_back(&o);
      }
      if (relevant.size() < 2) {
        chosen[p.key] = draw_uniform(p, r, rng);
        continue;
      }
      std::stable_sort(relevant.begin(), relevant.end(),
                       [](const Observation* a, const Observation* b) { return a->loss < b->loss; });
      // gamma(n) = min(ceil(0.1 n), 25), as Optuna's default.
      const auto n_below =
          static_cast<std::size_t>(std::clamp<double>(std::ceil(0.1 * double(relevant.size())), 1.0, 25.0));
      std::vector<double> below, above;
      for (std::size_t i = 0; i < relevant.size(); ++i)
        (i < n_below ? below : above).push_back(relevant[i]->internal.at(p.key));
      chosen[p.key] = p.kind == Kind::Choice ? pick_category(r.values.size(), below, above, rng)
                                             : pick_number(p, r, below, above, rng);
    }
    return space.make(chosen);
  }

 private:
  double pick_number(const SearchParam& p, const ParamRange& r, const std::vector<double>& below,
                     const std::vector<double>& above, std::mt19937_64& rng) const {
    const auto [lo, hi] = bounds(p, r);
    if (hi <= lo) return lo;
    const Parzen l(below, lo, hi, s_.prior_weight), g(above, lo, hi, s_.prior_weight);
    double best = 0, best_score = -INFINITY;
    for (std::int64_t i = 0; i < s_.candidates; ++i) {
      const double x = l.draw(rng);
      const double score = l.log_density(x) - g.log_density(x);
      if (score > best_score) best_score = score, best = x;
    }
    return best;
  }

  double pick_category(std::size_t k, const std::vector<double>& below, const std::vector<double>& above,
                       std::mt19937_64& rng) const {
    const auto l = category_probabilities(below, k, s_.prior_weight);
    const auto g = category_probabilities(above, k, s_.prior_weight);
    std::discrete_distribution<std::size_t> draw(l.begin(), l.end());
    std::size_t best = 0;
    double best_score = -INFINITY;
    for (std::int64_t i = 0; i < s_.candidates; ++i) {
      const std::size_t c = draw(rng);
      const double score = std::log(l[c]) - std::log(g[c]);
      if (score > best_score) best_score = score, best = c;
    }
    return double(best);
  }

  TpeSettings s_;
};

}  // namespace

std::unique_ptr<Sampler> grid_sampler() { return std::make_unique<GridSampler>(); }
std::unique_ptr<Sampler> random_sampler() { return std::make_unique<RandomSampler>(); }
std::unique_ptr<Sampler> tpe_sampler(TpeSettings settings) { return std::make_unique<TpeSampler>(settings); }

std::unique_ptr<Sampler> make_sampler(const std::string& name) {
  if (name == "grid") return grid_sampler();
  if (name == "random") return random_sampler();
  if (name == "tpe") return tpe_sampler();
  throw UsageError(fmt::format("sampler \"{}\": expected one of grid, random, tpe", name));
}

}  // namespace trainer::tune
