#include "search_space.h"

#include <fmt/ranges.h>
#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "trainer/error.h"

namespace trainer::tune {
namespace {

using Kind = SearchParam::Kind;

const char* kKinds = "choice, int, uniform, log_uniform";

std::vector<std::string> values_of(const ConfigValue& v) {
  std::vector<std::string> out;
  if (const auto* s = std::get_if<std::vector<std::string>>(&v)) return *s;
  if (const auto* i = std::get_if<std::vector<std::int64_t>>(&v)) {
    for (auto x : *i) out.push_back(std::to_string(x));
  } else if (const auto* d = std::get_if<std::vector<double>>(&v)) {
    for (auto x : *d) out.push_back(config_value_to_toml(ConfigValue{x}));
  }
  return out;
}

/// Reads low/high/step/values of `t` over `base` (a case overrides only what it names).
ParamRange read_range(const Config& t, const std::string& path, Kind kind, ParamRange base,
                      std::vector<std::string>& problems) {
  const auto where = [&](const std::string& k) { return t.origin(k) + ": " + path + "." + k; };
  // A key of the other kind is a mistake, not something to ignore: `values` on an int range
  // would otherwise leave it at 0..0.
  const auto refuse = [&](const std::string& k, const char* why) {
    if (t.has(k)) problems.push_back(where(k) + ": " + why);
  };
  try {
    if (kind == Kind::Choice) {
      for (const char* k : {"low", "high", "step"}) refuse(k, "a choice takes `values = [...]`, not low/high/step");
      if (t.has("values")) {
        base.values = values_of(t.value("values"));
        if (base.values.empty()) problems.push_back(where("values") + ": expected a non-empty list of values");
      }
    } else {
      refuse("values", "a numeric range takes low and high (and, for an int, step); use type = \"choice\" for a list");
      if (kind != Kind::Int) refuse("step", "only an int range has a step");
      if (t.has("low")) base.low = t.get<double>("low");
      if (t.has("high")) base.high = t.get<double>("high");
      if (kind == Kind::Int && t.has("step")) base.step = t.get<std::int64_t>("step");
    }
  } catch (const ConfigError& e) {
    for (const auto& p : e.problems()) problems.push_back(p);
  }
  return base;
}

void check_range(const ParamRange& r, Kind kind, const std::string& what, std::vector<std::string>& problems) {
  if (kind == Kind::Choice) {
    if (r.values.empty()) problems.push_back(what + ": a choice needs `values = [...]`");
    return;
  }
  if (!(r.low <= r.high)) {
    problems.push_back(fmt::format("{}: low {:g} must be <= high {:g}", what, r.low, r.high));
  }
  if (kind == Kind::LogUniform && !(r.low > 0)) {
    problems.push_back(fmt::format("{}: log_uniform needs low > 0 (got {:g})", what, r.low));
  }
  if (kind == Kind::Int) {
    if (r.step < 1) problems.push_back(fmt::format("{}: step {} must be >= 1", what, r.step));
    if (r.low != std::floor(r.low) || r.high != std::floor(r.high)) {
      problems.push_back(
          fmt::format("{}: an int range needs integer low and high (got {:g}, {:g})", what, r.low, r.high));
    }
  }
}

/// Collects parameter tables below `t` (path relative to [sweep.space]).
void collect(const Config& t, const std::string& path, const std::string& where, std::vector<SearchParam>& out,
             std::vector<std::string>& problems) {
  if (t.has("type") && !t.is_table("type")) {
    SearchParam p;
    p.key = path;
    const std::string full = where + "." + path;
    std::string type;
    try {
      type = t.get<std::string>("type");
    } catch (const ConfigError& e) {
      for (const auto& m : e.problems()) problems.push_back(m);
      return;
    }
    if (type == "choice") {
      p.kind = Kind::Choice;
    } else if (type == "int") {
      p.kind = Kind::Int;
    } else if (type == "uniform") {
      p.kind = Kind::Uniform;
    } else if (type == "log_uniform") {
      p.kind = Kind::LogUniform;
    } else {
      problems.push_back(fmt::format("{}: {}.type = \"{}\": expected one of {}", t.origin("type"), full, type, kKinds));
      return;
    }
    p.range = read_range(t, full, p.kind, {}, problems);
    if (p.kind != Kind::Choice) {
      for (const char* k : {"low", "high"}) {
        if (!t.has(k)) problems.push_back(fmt::format("{}: {}: {} needs `{}`", t.origin("type"), full, type, k));
      }
    }
    check_range(p.range, p.kind, t.origin("type") + ": " + full, problems);
    if (t.has("condition_on")) {
      try {
        p.condition_on = t.get<std::string>("condition_on");
      } catch (const ConfigError& e) {
        for (const auto& m : e.problems()) problems.push_back(m);
      }
      for (const auto& c : t.keys("cases")) {
        const Config ct = t.sub("cases." + c);
        p.cases[c] = read_range(ct, full + ".cases." + c, p.kind, p.range, problems);
        check_range(p.cases[c], p.kind, full + ".cases." + c, problems);
      }
    } else if (t.has("cases")) {
      problems.push_back(fmt::format("{}.cases: needs condition_on = \"<another parameter>\"", full));
    }
    for (const auto& k : t.keys()) {
      static const std::vector<std::string> known{"type", "values", "low", "high", "step", "condition_on", "cases"};
      if (std::find(known.begin(), known.end(), k) != known.end()) continue;
      if (t.is_table(k)) {
        collect(t.sub(k), path + "." + k, where, out, problems);
      } else {
        problems.push_back(
            fmt::format("{}: {}.{}: unknown; a parameter has type, values, low, high, step, condition_on, cases",
                        t.origin(k), full, k));
      }
    }
    out.push_back(std::move(p));
    return;
  }
  for (const auto& k : t.keys()) {
    const std::string sub = path.empty() ? k : path + "." + k;
    if (t.is_table(k)) {
      collect(t.sub(k), sub, where, out, problems);
    } else {
      problems.push_back(
          fmt::format("{}: {}.{}: a parameter is a table with a type ({})", t.origin(k), where, sub, kKinds));
    }
  }
}

}  // namespace

const ParamRange& SearchParam::range_for(const std::string& parent_value) const {
  const auto it = cases.find(parent_value);
  return it == cases.end() ? range : it->second;
}

std::vector<std::string> Assignment::overrides() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : values) out.push_back(k + "=" + v);
  return out;
}

std::string Assignment::get(const std::string& key) const {
  for (const auto& [k, v] : values) {
    if (k == key) return v;
  }
  return {};
}

SearchSpace SearchSpace::from_config(const Config& space, const std::string& where) {
  std::vector<std::string> problems;
  std::vector<SearchParam> params;
  collect(space, "", where, params, problems);
  if (params.empty() && problems.empty()) {
    problems.push_back(where + ": no parameters; e.g. [" + where +
                       ".optim.lr] type = \"log_uniform\" low = 1e-4 high = 1e-2");
  }
  // Order: a parameter after the one it is conditioned on.
  SearchSpace s;
  std::vector<bool> placed(params.size(), false);
  for (std::size_t round = 0; round < params.size(); ++round) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (placed[i]) continue;
      const auto& cond = params[i].condition_on;
      const bool ready = cond.empty() || std::any_of(s.params_.begin(), s.params_.end(),
                                                     [&](const SearchParam& p) { return p.key == cond; });
      if (ready) {
        s.params_.push_back(params[i]);
        placed[i] = true;
      }
    }
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (placed[i]) continue;
    const auto& cond = params[i].condition_on;
    const bool exists = std::any_of(params.begin(), params.end(), [&](const SearchParam& p) { return p.key == cond; });
    problems.push_back(fmt::format("{}.{}.condition_on = \"{}\": {}", where, params[i].key, cond,
                                   exists ? "a cycle of conditions" : "no such parameter in the space"));
  }
  for (const auto& p : s.params_) {
    if (p.condition_on.empty()) continue;
    const auto& parent = *std::find_if(s.params_.begin(), s.params_.end(),
                                       [&](const SearchParam& q) { return q.key == p.condition_on; });
    if (parent.kind != Kind::Choice) {
      problems.push_back(fmt::format("{}.{}.condition_on = \"{}\": only a choice parameter can be conditioned on",
                                     where, p.key, p.condition_on));
      continue;
    }
    std::vector<std::string> parent_values = parent.range.values;  // in any of its cases too
    for (const auto& [pc, pr] : parent.cases)
      parent_values.insert(parent_values.end(), pr.values.begin(), pr.values.end());
    for (const auto& [c, r] : p.cases) {
      if (std::find(parent_values.begin(), parent_values.end(), c) == parent_values.end()) {
        problems.push_back(fmt::format("{}.{}.cases.{}: '{}' is not a value of {} ({})", where, p.key, c, c, parent.key,
                                       fmt::join(parent.range.values, ", ")));
      }
    }
  }
  if (!problems.empty()) throw ConfigError(problems);
  return s;
}

std::string SearchSpace::format(const SearchParam& p, double value) {
  if (p.kind == Kind::Int) return std::to_string(std::llround(value));
  std::ostringstream s;
  s.precision(6);
  s << value;
  std::string t = s.str();
  // TOML needs a float to look like one: "1" -> "1.0", "1e-05" stays.
  if (t.find_first_of(".eEn") == std::string::npos) t += ".0";
  return t;
}

Assignment SearchSpace::make(const std::map<std::string, double>& internal) const {
  Assignment a;
  for (const auto& p : params_) {
    const ParamRange& r = p.condition_on.empty() ? p.range : p.range_for(a.get(p.condition_on));
    const auto it = internal.find(p.key);
    double x = it == internal.end() ? 0.0 : it->second;
    std::string text;
    switch (p.kind) {
      case Kind::Choice: {
        const auto n = static_cast<std::int64_t>(r.values.size());
        const auto i = std::clamp<std::int64_t>(std::llround(x), 0, n - 1);
        x = double(i);
        text = r.values[static_cast<std::size_t>(i)];
        break;
      }
      case Kind::Int: {
        const std::int64_t steps = std::llround((x - r.low) / double(r.step));
        const std::int64_t max_steps = static_cast<std::int64_t>((r.high - r.low) / double(r.step));
        x = r.low + double(std::clamp<std::int64_t>(steps, 0, max_steps) * r.step);
        text = format(p, x);
        break;
      }
      case Kind::Uniform:
        x = std::clamp(x, r.low, r.high);
        text = format(p, x);
        x = std::stod(text);  // what is run is what is recorded
        break;
      case Kind::LogUniform: {
        const double v = std::clamp(std::exp(x), r.low, r.high);
        text = format(p, v);
        x = std::log(std::stod(text));
        break;
      }
    }
    a.values.emplace_back(p.key, text);
    a.internal[p.key] = x;
  }
  return a;
}

std::int64_t SearchSpace::grid_size() const {
  // Conditional ranges make the count depend on the parent's value: count by walking the grid,
  // one branch per value of a choice (a parameter's count is the same for every value of the
  // parameters after it).
  constexpr std::int64_t kMax = 1000000;
  bool continuous = false;
  std::function<std::int64_t(std::size_t, Assignment&)> count = [&](std::size_t i, Assignment& a) -> std::int64_t {
    if (i == params_.size()) return 1;
    const auto& p = params_[i];
    const ParamRange& r = p.condition_on.empty() ? p.range : p.range_for(a.get(p.condition_on));
    if (p.kind == Kind::Uniform || p.kind == Kind::LogUniform) {
      continuous = true;
      return 0;
    }
    if (p.kind == Kind::Int) {
      const double n = std::floor((r.high - r.low) / double(r.step)) + 1;
      TRAINER_CHECK_T(UsageError, n <= double(kMax), "the grid of ", p.key, " alone has ", n,
                      " points; more than 1,000,000: use sampler \"random\" or \"tpe\"");
      a.values.emplace_back(p.key, format(p, r.low));
      const std::int64_t rest = count(i + 1, a);
      a.values.pop_back();
      TRAINER_CHECK_T(UsageError, double(rest) * n <= double(kMax),
                      "the grid has more than 1,000,000 points: use sampler \"random\" or \"tpe\"");
      return rest * static_cast<std::int64_t>(n);
    }
    std::int64_t total = 0;
    for (const auto& v : r.values) {
      a.values.emplace_back(p.key, v);
      total += count(i + 1, a);
      a.values.pop_back();
      TRAINER_CHECK_T(UsageError, total <= kMax,
                      "the grid has more than 1,000,000 points: use sampler \"random\" or \"tpe\"");
    }
    return total;
  };
  Assignment a;
  const std::int64_t n = count(0, a);
  return continuous ? 0 : n;
}

Assignment SearchSpace::grid_point(std::int64_t index) const {
  std::int64_t seen = 0;
  Assignment found;
  bool done = false;
  std::map<std::string, double> internal;
  std::function<void(std::size_t, Assignment&)> walk = [&](std::size_t i, Assignment& a) {
    if (done) return;
    if (i == params_.size()) {
      if (seen++ == index) {
        found = make(internal);
        done = true;
      }
      return;
    }
    const auto& p = params_[i];
    const ParamRange& r = p.condition_on.empty() ? p.range : p.range_for(a.get(p.condition_on));
    const std::int64_t n = p.kind == Kind::Choice ? static_cast<std::int64_t>(r.values.size())
                                                  : static_cast<std::int64_t>((r.high - r.low) / double(r.step)) + 1;
    for (std::int64_t k = 0; k < n && !done; ++k) {
      const double x = p.kind == Kind::Choice ? double(k) : r.low + double(k * r.step);
      internal[p.key] = x;
      a.values.emplace_back(p.key, p.kind == Kind::Choice ? r.values[std::size_t(k)] : format(p, x));
      walk(i + 1, a);
      a.values.pop_back();
    }
  };
  Assignment a;
  walk(0, a);
  TRAINER_CHECK(done, "grid point ", index, " is outside the grid of ", seen, " points");
  return found;
}

}  // namespace trainer::tune
