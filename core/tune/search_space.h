#pragma once
// The search space of `trainer sweep`: which config keys a study varies and over what, read
// from the recipe's [sweep.space] table. A parameter is a table with a `type`, at the path of
// the key it sets:
//
//   [sweep.space.optim.lr]                 # sets optim.lr
//   type = "log_uniform"                   # choice | int | uniform | log_uniform
//   low = 1e-4
//   high = 1e-2
//
//   [sweep.space.model]                    # a config group: model=mlp / model=cnn
//   type = "choice"
//   values = ["mlp", "cnn"]
//
//   [sweep.space.training.batch_size]
//   type = "int"
//   low = 32
//   high = 512
//   step = 32
//   condition_on = "model"                 # its range depends on the model chosen
//   [sweep.space.training.batch_size.cases.cnn]
//   high = 128                             # a heavy model gets a smaller batch range
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "trainer/config.h"

namespace trainer::tune {

/// The range of a parameter (or of one case of a conditional parameter).
struct ParamRange {
  std::vector<std::string> values;  ///< choice: the values as override text ("mlp", "32", "0.5")
  double low = 0, high = 0;         ///< int, uniform, log_uniform: inclusive bounds
  std::int64_t step = 1;            ///< int: the grid step from low
};

struct SearchParam {
  enum class Kind { Choice, Int, Uniform, LogUniform };
  std::string key;  ///< the config key or group it sets ("optim.lr", "model")
  Kind kind = Kind::Choice;
  ParamRange range;
  std::string condition_on;                 ///< another parameter's key; empty when unconditional
  std::map<std::string, ParamRange> cases;  ///< that parameter's value -> the range to use
  /// The range when the parameter it is conditioned on took `parent_value`.
  const ParamRange& range_for(const std::string& parent_value) const;
};

/// One point of the space: per key, the value as override text and as a number (choice: the
/// index of the value in its range; int/uniform: the value; log_uniform: its natural log).
struct Assignment {
  std::vector<std::pair<std::string, std::string>> values;  ///< in the space's order
  std::map<std::string, double> internal;
  /// The overrides that set it: "optim.lr=0.00316", "model=cnn".
  std::vector<std::string> overrides() const;
  /// The value text of `key` ("" when absent).
  std::string get(const std::string& key) const;
};

class SearchSpace {
 public:
  /// Reads [sweep.space] (`space` is that table); a parameter conditioned on another comes
  /// after it. Every problem is collected and thrown as one ConfigError (file:line).
  static SearchSpace from_config(const Config& space, const std::string& where);
  const std::vector<SearchParam>& params() const { return params_; }
  /// The number of points when every parameter is a choice or an int range; 0 otherwise.
  std::int64_t grid_size() const;
  /// Point `index` (0-based) of the grid, the first parameter varying slowest.
  Assignment grid_point(std::int64_t index) const;
  /// The text of a number for `p` (ints exact, floats with 6 significant digits).
  static std::string format(const SearchParam& p, double value);
  /// Builds an assignment from numbers (internal form) in the space's order.
  Assignment make(const std::map<std::string, double>& internal) const;

 private:
  std::vector<SearchParam> params_;
};

}  // namespace trainer::tune
