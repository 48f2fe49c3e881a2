#pragma once
// `trainer lr-find`: Lightning's learning-rate finder. A short real run of the recipe whose
// learning rate rises exponentially from min_lr to max_lr, one step each; the training loss is
// smoothed as it goes, the sweep stops once that passes diverge_factor times its best, and the
// suggested learning rate is where the smoothed loss falls fastest.
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "trainer/states.h"

namespace trainer::tune {

struct LrFindRequest {
  std::string recipe;
  std::vector<std::string> overrides;    ///< the user's, as on the command line
  std::vector<std::string> plugin_dirs;  ///< --plugin-dir
  double min_lr = 1e-7;
  double max_lr = 1.0;
  std::int64_t steps = 100;     ///< optimizer steps of the sweep (the LR reaches max_lr at the last)
  double diverge_factor = 4.0;  ///< stop once the smoothed loss passes this times its best; 0 = never
  double beta = 0.98;   ///< smoothing of the loss (an exponential moving average, bias-corrected as Lightning's)
  std::string run_dir;  ///< empty: <run.dir>/<run.name>-lr-find-<time>
  std::string log_level = "info";
};

struct LrFindPoint {
  std::int64_t step = 0;  ///< global_step after it
  double lr = 0;          ///< the learning rate it ran at
  double loss = 0;        ///< its training loss
  double smoothed = 0;    ///< the smoothed loss up to it
};

struct LrFindResult {
  std::vector<LrFindPoint> points;
  std::optional<double> suggested_lr;
  std::int64_t suggested_index = -1;  ///< into points
  std::string no_suggestion;          ///< why there is none
  std::string stopped;                ///< why the sweep ended before its last step; empty: it ran them all
  double min_lr = 0, max_lr = 0;
  std::int64_t steps = 0;
  std::string run_dir;
  int exit_code = 0;
  RunStatus status = RunStatus::Finished;
  std::string message;  ///< the run's failure, if it failed
};

/// Runs the sweep (a real run in its own run directory, with lr_find.json written there) and
/// suggests a learning rate. Throws UsageError for settings that cannot work.
LrFindResult find_lr(const LrFindRequest& request);

/// Lightning's suggestion on the smoothed losses: leaving out the first `skip_begin` and the
/// last `skip_end` points and the non-finite ones, the gradient of the smoothed loss over the
/// learning rate (numpy's and torch's gradient, second order inside, with the uneven spacing of
/// the rates), and the rate where it is lowest. Sets suggested_lr and suggested_index, or
/// no_suggestion.
void suggest_lr(LrFindResult& r, std::int64_t skip_begin = 10, std::int64_t skip_end = 1);

/// The result as JSON (what lr_find.json holds and --json prints).
std::string lr_find_json(const LrFindResult& r);
/// The result for people: the sweep, why it stopped, the suggestion and how to use it.
void print_lr_find(const LrFindResult& r, std::ostream& out);

}  // namespace trainer::tune
