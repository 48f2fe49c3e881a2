#include "trainer/config_spec.h"

#include <fmt/ranges.h>
#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "trainer/error.h"
#include "trainer/secrets.h"

namespace trainer {

std::string value_type_name(ValueType t) {
  switch (t) {
    case ValueType::Int:
      return "integer";
    case ValueType::Float:
      return "float";
    case ValueType::Bool:
      return "bool";
    case ValueType::String:
      return "string";
    case ValueType::IntList:
      return "integer list";
    case ValueType::FloatList:
      return "float list";
    case ValueType::StringList:
      return "string list";
  }
  return "?";
}

KeySpec::KeySpec(std::string k, ValueType t, std::string d) : key(std::move(k)), type(t), doc(std::move(d)) {}

KeySpec& KeySpec::def(ConfigValue v) {
  default_value = std::move(v);
  return *this;
}
KeySpec& KeySpec::required() {
  is_required = true;
  default_value.reset();  // a required key has no default
  return *this;
}
KeySpec& KeySpec::min(double v, bool inclusive) {
  min_value = v;
  min_inclusive = inclusive;
  return *this;
}
KeySpec& KeySpec::max(double v, bool inclusive) {
  max_value = v;
  max_inclusive = inclusive;
  return *this;
}
KeySpec& KeySpec::choices(std::vector<std::string> c) {
  allowed = std::move(c);
  return *this;
}
KeySpec& KeySpec::check(KeyCheck c) {
  rule = std::move(c);
  return *this;
}

KeySpec& KeySpec::non_finite() {
  accepts_non_finite = true;
  return *this;
}

KeySpec& KeySpec::memory_neutral() {
  is_memory_neutral = true;
  return *this;
}

namespace {
std::string fmt_num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

std::string KeySpec::describe() const {
  std::string s = value_type_name(type);
  const bool list = type == ValueType::IntList || type == ValueType::FloatList || type == ValueType::StringList;
  std::vector<std::string> bounds;
  if (min_value) bounds.push_back((min_inclusive ? ">= " : "> ") + fmt_num(*min_value));
  if (max_value) bounds.push_back((max_inclusive ? "<= " : "< ") + fmt_num(*max_value));
  if (!bounds.empty()) s += (list ? " with elements " : " ") + fmt::to_string(fmt::join(bounds, " and "));
  if (!allowed.empty()) s += (list ? " with elements in: " : ", one of: ") + fmt::to_string(fmt::join(allowed, ", "));
  if (rule.accepts) s += (list ? " with elements: " : ": ") + rule.rule;
  return s;
}

std::string key_table_markdown(const std::vector<KeySpec>& keys, const std::string& prefix) {
  auto cell = [](std::string text) {
    std::string out;
    for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  std::string s = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& k : keys) {
    const std::string def = k.default_value ? "`" + config_value_to_toml(*k.default_value) + "`"
                            : k.is_required ? "required"
                                            : "not set";
    s += "| `" + prefix + k.key + "` | " + cell(k.describe()) + " | " + cell(def) + " | " + cell(k.doc) + " |\n";
  }
  return s;
}

namespace {

bool is_list(ValueType t) { return t == ValueType::IntList || t == ValueType::FloatList || t == ValueType::StringList; }

// Returns the value converted to the spec's type, or nullopt when the types do not fit.
std::optional<ConfigValue> coerce(const ConfigValue& v, ValueType t) {
  if (is_list(t)) {
    if (const auto* s = std::get_if<std::vector<std::string>>(&v); s && s->empty()) {
      switch (t) {
        case ValueType::IntList:
          return ConfigValue(std::vector<std::int64_t>{});
        case ValueType::FloatList:
          return ConfigValue(std::vector<double>{});
        default:
          return v;
      }
    }
  }
  switch (t) {
    case ValueType::Int:
      if (std::holds_alternative<std::int64_t>(v)) return v;
      break;
    case ValueType::Float:
      if (std::holds_alternative<double>(v)) return v;
      if (const auto* i = std::get_if<std::int64_t>(&v)) return ConfigValue(static_cast<double>(*i));
      break;
    case ValueType::Bool:
      if (std::holds_alternative<bool>(v)) return v;
      break;
    case ValueType::String:
      if (std::holds_alternative<std::string>(v)) return v;
      break;
    case ValueType::IntList:
      if (std::holds_alternative<std::vector<std::int64_t>>(v)) return v;
      break;
    case ValueType::FloatList:
      if (std::holds_alternative<std::vector<double>>(v)) return v;
      if (const auto* is = std::get_if<std::vector<std::int64_t>>(&v))
        return ConfigValue(std::vector<double>(is->begin(), is->end()));
      break;
    case ValueType::StringList:
      if (std::holds_alternative<std::vector<std::string>>(v)) return v;
      break;
  }
  return std::nullopt;
}

std::vector<double> numbers_of(const ConfigValue& v) {
  if (const auto* i = std::get_if<std::int64_t>(&v)) return {static_cast<double>(*i)};
  if (const auto* d = std::get_if<double>(&v)) return {*d};
  if (const auto* is = std::get_if<std::vector<std::int64_t>>(&v)) return {is->begin(), is->end()};
  if (const auto* ds = std::get_if<std::vector<double>>(&v)) return *ds;
  return {};
}

/// Why a float of `v` is not a usable number for `spec` (NaN, ±inf where the key does not
/// accept them, subnormals), or "".
std::string abnormal_number(const ConfigValue& v, const KeySpec& spec) {
  if (!std::holds_alternative<double>(v) && !std::holds_alternative<std::vector<double>>(v)) return {};
  for (double x : numbers_of(v)) {
    if (!std::isfinite(x) && !spec.accepts_non_finite)
      return "not a finite number (this key does not accept nan or inf)";
    if (std::fpclassify(x) == FP_SUBNORMAL) {
      return "too close to zero to be a normal double (|x| < 2.2e-308, precision lost); use 0 or a larger value";
    }
  }
  return {};
}

std::vector<std::string> strings_of(const ConfigValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return {*s};
  if (const auto* ss = std::get_if<std::vector<std::string>>(&v)) return *ss;
  return {};
}

}  // namespace

std::vector<std::string> validate_config(Config& cfg, const std::vector<SectionSpec>& sections,
                                         const std::vector<std::string>& open_sections) {
  std::vector<std::string> problems;
  std::map<std::string, std::map<std::string, const KeySpec*>> by_section;
  std::vector<std::string> known_full;
  for (const auto& s : sections) {
    auto& keys = by_section[s.path];
    for (const auto& k : s.keys) {
      keys[k.key] = &k;
      known_full.push_back(s.path.empty() ? k.key : s.path + "." + k.key);
    }
  }
  auto is_open = [&](const std::string& key) {
    for (const auto& o : open_sections) {
      if (key == o || key.rfind(o + ".", 0) == 0) return true;
    }
    return false;
  };

  for (const auto& key : cfg.leaf_keys()) {
    if (is_open(key)) continue;
    // The longest section path that prefixes the key.
    const KeySpec* spec = nullptr;
    std::string section;
    bool section_found = false;
    for (const auto& kv : by_section) {
      const std::string& p = kv.first;
      if (!p.empty() && key.rfind(p + ".", 0) != 0) continue;
      if (section_found && p.size() <= section.size()) continue;
      const std::string rest = p.empty() ? key : key.substr(p.size() + 1);
      auto it = kv.second.find(rest);
      section = p;
      section_found = true;
      spec = it == kv.second.end() ? nullptr : it->second;
    }
    const std::string where = cfg.origin(key);
    if (!spec) {
      std::string msg = fmt::format("{}: unknown key '{}'", where, key);
      msg += did_you_mean(key, known_full);
      if (section_found && !section.empty()) {
        std::vector<std::string> names;
        for (const auto& kv : by_section[section]) names.push_back(kv.first);
        msg += fmt::format(" (keys of [{}]: {})", section, fmt::join(names, ", "));
      }
      problems.push_back(msg);
      continue;
    }
    const ConfigValue& v = cfg.value(key);
    // Messages go to the log and status.json: a secret's value is not in them (trainer/secrets.h).
    const std::string shown = is_secret_key(key) ? "(a secret, not shown)" : without_userinfo(config_value_to_toml(v));
    const auto coerced = coerce(v, spec->type);
    if (!coerced) {
      problems.push_back(fmt::format("{}: {} = {}: expected {}, got {}", where, key, shown, spec->describe(),
                                     config_value_type_name(v)));
      continue;
    }
    if (const std::string bad = abnormal_number(*coerced, *spec); !bad.empty()) {
      problems.push_back(fmt::format("{}: {} = {}: {}; allowed: {}", where, key, shown, bad, spec->describe()));
      continue;
    }
    bool ok = true;
    for (double x : numbers_of(*coerced)) {
      if (spec->min_value && (spec->min_inclusive ? x < *spec->min_value : x <= *spec->min_value)) ok = false;
      if (spec->max_value && (spec->max_inclusive ? x > *spec->max_value : x >= *spec->max_value)) ok = false;
    }
    if (!spec->allowed.empty()) {
      for (const auto& s : strings_of(*coerced)) {
        if (std::find(spec->allowed.begin(), spec->allowed.end(), s) == spec->allowed.end()) {
          ok = false;
          const std::string hint = closest_match(s, spec->allowed);
          if (!hint.empty()) {
            problems.push_back(
                fmt::format("{}: {} = {}: must be {} (did you mean '{}'?)", where, key, shown, spec->describe(), hint));
            ok = true;  // reported with its hint already
            break;
          }
        }
      }
    }
    if (!ok) {
      problems.push_back(fmt::format("{}: {} = {}: must be {}", where, key, shown, spec->describe()));
      continue;
    }
    if (spec->rule.accepts) {
      const auto values = strings_of(*coerced);
      if (!std::all_of(values.begin(), values.end(), spec->rule.accepts)) {
        problems.push_back(fmt::format("{}: {} = {}: must be {}", where, key, shown, spec->rule.rule));
        continue;
      }
    }
    if (coerced->index() != v.index()) cfg.set(key, *coerced, where);
  }

  for (const auto& s : sections) {
    for (const auto& k : s.keys) {
      const std::string full = s.path.empty() ? k.key : s.path + "." + k.key;
      if (cfg.has(full)) {
        if (cfg.is_table(full)) {
          problems.push_back(fmt::format("{}: '{}' must be a value of type {}, not a table", cfg.origin(full), full,
                                         value_type_name(k.type)));
        }
        continue;
      }
      if (k.is_required) {
        problems.push_back(fmt::format("missing required key '{}' ({}: {})", full, k.describe(), k.doc));
      } else if (k.default_value) {
        cfg.set(full, *k.default_value, "default");
      }
    }
  }
  return problems;
}

}  // namespace trainer
