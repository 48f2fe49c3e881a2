#pragma once
// How `trainer sweep` picks the next trial's parameters: grid, random, or TPE (the
// tree-structured Parzen estimator of Bergstra et al. 2011, univariate as in Optuna's
// default TPESampler): after `startup` random trials, the finished trials are split into the
// best gamma(n) and the rest, a Parzen density is fitted to each per parameter, and of
// `candidates` points drawn from the good density the one with the largest l(x)/g(x) is taken.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "search_space.h"

namespace trainer::tune {

/// A finished trial as the sampler sees it: its point and its objective, lower is better
/// (the study negates a maximised metric).
struct Observation {
  std::map<std::string, double> internal;  ///< Assignment::internal
  double loss = 0;
};

class Sampler {
 public:
  virtual ~Sampler() = default;
  /// The point of trial `number` (0-based) given the finished trials so far. `rng` is seeded
  /// per trial by the study, so a resumed study samples what it would have.
  virtual Assignment sample(const SearchSpace& space, std::int64_t number, const std::vector<Observation>& history,
                            std::mt19937_64& rng) = 0;
};

/// Trial n = grid point n (wraps around past the grid's end).
std::unique_ptr<Sampler> grid_sampler();
/// Uniform over each range (log-uniform in log space).
std::unique_ptr<Sampler> random_sampler();

struct TpeSettings {
  std::int64_t startup = 10;     ///< random trials first
  std::int64_t candidates = 24;  ///< draws from l(x) per parameter
  double prior_weight = 1.0;     ///< weight of the prior (uniform over the range) in each density
};
std::unique_ptr<Sampler> tpe_sampler(TpeSettings settings = {});

/// "grid", "random", "tpe"; UsageError naming the allowed ones otherwise.
std::unique_ptr<Sampler> make_sampler(const std::string& name);

}  // namespace trainer::tune
