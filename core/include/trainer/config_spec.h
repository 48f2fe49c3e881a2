#pragma once
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/export.h"

namespace trainer {

/// Value kinds a KeySpec may require.
enum class ValueType { Int, Float, Bool, String, IntList, FloatList, StringList };

/// "integer", "float", ...
TRAINER_API std::string value_type_name(ValueType t);

/// A rule for string values (and the elements of string lists) beyond a list of choices,
/// such as the device grammar `cpu | cuda | cuda:N` (device_setting_check in devices.h).
struct KeyCheck {
  std::string rule;                                 ///< what is allowed: "cpu, cuda or cuda:N"
  std::function<bool(const std::string&)> accepts;  ///< true for a value that follows the rule
};

/// Declares one config key of a component: its type, default, allowed range or choices and
/// a one-line doc. Built fluently:
/// `KeySpec("lr", ValueType::Float, "Peak learning rate").def(1e-3).min(0, false)`.
struct TRAINER_API KeySpec {
  KeySpec(std::string key, ValueType type, std::string doc);

  KeySpec& def(ConfigValue v);                    ///< default filled into the resolved config
  KeySpec& required();                            ///< must be present (drops the default)
  KeySpec& min(double v, bool inclusive = true);  ///< numbers and numeric list elements
  KeySpec& max(double v, bool inclusive = true);
  KeySpec& choices(std::vector<std::string> c);  ///< strings and string list elements
  KeySpec& check(KeyCheck c);                    ///< strings and string list elements
  /// Accepts NaN and ±inf (floats). Without it a float must be finite, and not subnormal.
  KeySpec& non_finite();
  /// One memory estimate holds for every value of this key: it changes nothing a training step
  /// holds (a learning rate, a seed, how often to log or checkpoint), or the estimate's fit
  /// covers it (the batch sizes). `trainer sweep` and `trainer bench` share an estimate across
  /// configs that differ in such keys only. A key without it is taken to change memory: a new
  /// estimate per value, slower but never wrong.
  KeySpec& memory_neutral();

  std::string key;  ///< relative to the section, may be dotted ("betas")
  ValueType type;
  std::string doc;
  std::optional<ConfigValue> default_value;
  bool is_required = false;
  std::optional<double> min_value, max_value;
  bool min_inclusive = true, max_inclusive = true;
  std::vector<std::string> allowed;
  KeyCheck rule;  ///< empty `accepts`: no rule
  bool accepts_non_finite = false;
  bool is_memory_neutral = false;

  /// "float >= 0", "one of: constant, step, cosine" — for messages and `trainer plugins`.
  std::string describe() const;
};

/// A Markdown table of `keys` (key, type, default, meaning), each key prefixed with
/// `prefix` ("plugins.console."): the config-key tables of the plugin READMEs are this text
/// (`trainer plugins --markdown` prints it; a test compares).
TRAINER_API std::string key_table_markdown(const std::vector<KeySpec>& keys, const std::string& prefix);

/// The keys of one config section (`training`, `model`, `plugins.console`).
struct TRAINER_API SectionSpec {
  std::string path;           ///< dotted section path
  std::vector<KeySpec> keys;  ///< allowed keys
  std::string doc;
};

/// Checks `cfg` against `sections`: unknown keys (with a did-you-mean), unknown sections,
/// wrong types, out-of-range values and missing required keys, each message naming the key,
/// its origin, the bad value and what is allowed. Fills defaults into `cfg`. Returns all
/// problems (empty = valid). Sections listed in `open_sections` may hold any keys.
TRAINER_API std::vector<std::string> validate_config(Config& cfg, const std::vector<SectionSpec>& sections,
                                                     const std::vector<std::string>& open_sections = {});

/// "; did you mean 'optim.lr'?" for `known`'s key of that meaning where `key` is another tool's
/// name for it (`optim.learning_rate`, `optim.warmup`: Lightning's, Hugging Face's, torchtune's),
/// for a near-miss in its own section (`training.epoch`), or for the key of that name in
/// another section (`optim.warmup_steps`); else "; did you mean section [training]?" when only
/// the first component is misspelt; else "".
TRAINER_API std::string did_you_mean(const std::string& key, const std::vector<std::string>& known);

/// The closest candidate within a small edit distance, or "" (for did-you-mean hints).
TRAINER_API std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace trainer
