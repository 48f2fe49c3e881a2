#pragma once
// Private to `trainer sweep`: what a trial's run directory says about how it went.
#include <map>
#include <string>

#include "trainer/run_records.h"

namespace trainer::tune {

/// What ran out of memory, from the run's status.json (`status`: the phase and the last
/// micro-batch tried) and its config.toml: phase, micro_batch_size, model,
/// dataset, batch_size (the effective batch) and the image or sequence size where the config
/// has one.
std::map<std::string, std::string> oom_details(const std::string& run_dir, const RunStatusRecord& status);

}  // namespace trainer::tune
