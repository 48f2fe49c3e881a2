#pragma once
// Private to `trainer sweep`: the pruners. A trial's intermediate reports are the values of
// the objective it logs (with eval/accuracy: one per evaluation); trials are compared report
// by report, the k-th report of each.
#include <cstdint>
#include <map>
#include <string>

#include "sweep.h"

namespace trainer::tune {

/// Why the study's pruner stops `trial` after its latest report; "" when it goes on.
///   median:             after pruner_warmup reports, when its report is worse than the median of
///                       the completed trials' reports at that point (pruner_min_trials of them)
///   successive_halving: at the rungs (min_resource * reduction_factor^i reports), when it is not
///                       within the best 1/reduction_factor of every trial that reached the rung
/// `trials` holds every trial of the study by number (ended and running).
std::string prune_reason(const SweepSettings& s, const TrialRecord& trial,
                         const std::map<std::int64_t, TrialRecord>& trials);

}  // namespace trainer::tune
