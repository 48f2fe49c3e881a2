#pragma once
// `trainer bench`: a benchmark suite over a grid of overrides. Each cell is the recipe with one
// value per grid key; it runs warm-up steps then measured steps (a real run in this process,
// inside the recipe's budget, with its plugins; oom_backoff recovers as it would in training)
// and reports samples/s, step time (median and spread), peak memory and whether it ran out of
// memory. A cell that `trainer estimate` predicts not to fit is marked and not run.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace trainer::tune {

/// One grid key and its values, as typed: `training.micro_batch_size=32,64`.
struct GridAxis {
  std::string key;
  std::vector<std::string> values;
};

/// Parses `--grid "k1=a,b k2=c,d"`: axes separated by spaces, values by commas (commas inside
/// [...] or quotes belong to the value: `plugins.load=["a","b"],[]`). UsageError naming the
/// bad part otherwise.
std::vector<GridAxis> parse_grid(const std::string& text);

/// Every combination, the first axis varying slowest: each cell as `key=value` overrides.
std::vector<std::vector<std::string>> grid_cells(const std::vector<GridAxis>& axes);

struct BenchRequest {
  std::string recipe;
  std::vector<std::string> overrides;  ///< applied to every cell, before the cell's own
  std::vector<std::string> plugin_dirs;
  std::vector<GridAxis> grid;
  std::int64_t steps = 10;  ///< measured optimizer steps per cell
  std::int64_t warmup = 2;  ///< steps run first and not measured
  bool estimate = true;     ///< predict each cell's memory and skip those that cannot fit
  double margin = 0.10;     ///< the estimate's margin
  /// Where each cell's run directory is made, private (mkdtemp, mode 0700) and removed after the
  /// cell (ShortRunSpec::work_dir); empty: $TMPDIR.
  std::string work_dir;
};

/// How a bench cell ended; its name ("predicted_oom") is the table's status column.
enum class CellStatus : std::uint8_t {
  Ok,            ///< "ok": measured
  Oom,           ///< "oom": ran out of memory and did not recover
  PredictedOom,  ///< "predicted_oom": skipped, predicted not to fit
  Failed,        ///< "failed"
};
/// "predicted_oom".
const char* cell_status_name(CellStatus status);
std::ostream& operator<<(std::ostream& os, CellStatus status);

struct BenchCell {
  std::vector<std::string> overrides;  ///< the cell's grid values
  CellStatus status = CellStatus::Ok;
  std::string message;                           ///< why it failed, what the prediction said
  std::int64_t batch_size = 0, micro_batch = 0;  ///< as configured
  std::int64_t micro_batch_used = 0;             ///< at the last step (oom_backoff may have lowered it)
  bool out_of_memory = false;                    ///< an out-of-memory error happened (recovered or not)
  std::int64_t measured_steps = 0;
  double samples_per_s = 0;  ///< over the measured steps
  double step_ms_median = 0, step_ms_min = 0, step_ms_max = 0;
  std::int64_t peak = 0;             ///< bytes, highest over all the cell's steps
  std::int64_t predicted_peak = -1;  ///< bytes; -1 when not estimated
};

struct BenchReport {
  std::string device;
  std::vector<std::string> keys;  ///< the grid's keys, in order
  std::vector<BenchCell> cells;
};

/// Runs every cell; `progress` gets one line per cell as it ends. Throws ConfigError /
/// UsageError / PluginError for a recipe or a cell whose overrides do not load.
BenchReport run_bench(const BenchRequest& request, std::ostream& progress);

void print_bench_table(const BenchReport& r, std::ostream& out);
void write_bench_csv(const BenchReport& r, std::ostream& out);
/// A CSV field as RFC 4180 has it: quoted, quotes doubled, when it holds a comma, a quote or a
/// line break.
std::string csv_field(const std::string& s);
void write_bench_markdown(const BenchReport& r, std::ostream& out);

}  // namespace trainer::tune
