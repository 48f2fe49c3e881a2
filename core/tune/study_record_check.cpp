#include "study_journal.h"

#include <fmt/ranges.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>

#include "trainer/error.h"

// What a study's journal is checked for when it is read back (declared in study_journal.h):
// each record, field by field, before replay() uses it. The study record against this study's
// (study_differences) before a resume goes on: study_differences.cpp.
namespace trainer::tune {

using json = nlohmann::json;

// Each record of the journal, before replay() uses it.

namespace {

/// The trial's point; replay() has checked that params holds strings and internal numbers.
Assignment params_from(const json& j, const SearchSpace& space) {
  Assignment a;
  const json& params = j.at("params");
  const json& internal = j.at("internal");
  for (const auto& prm : space.params()) {
    if (!params.contains(prm.key)) continue;
    a.values.emplace_back(prm.key, params.at(prm.key).get<std::string>());
    if (internal.contains(prm.key)) a.internal[prm.key] = internal.at(prm.key).get<double>();
  }
  return a;
}

/// A JSON value in a message: its text, cut at 60 characters, and what it is.
std::string shown(const json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  const char* what = v.is_null()             ? "null"
                     : v.is_boolean()        ? "a boolean"
                     : v.is_number_integer() ? "an integer"
                     : v.is_number()         ? "a number"
                     : v.is_string()         ? "a string"
                     : v.is_array()          ? "an array"
                                             : "an object";
  return text + " (" + what + ")";
}

/// What a field of a record must be.
enum class Want { Integer, Number, NumberOrNull, String, Bool, StringArray, Array, Object, StringObject, NumberObject };

const char* want_text(Want w) {
  switch (w) {
    case Want::Integer:
      return "an integer >= 0";
    case Want::Number:
      return "a number";
    case Want::NumberOrNull:
      return "a number or null";
    case Want::String:
      return "a string";
    case Want::Bool:
      return "true or false";
    case Want::StringArray:
      return "an array of strings";
    case Want::Array:
      return "an array";
    case Want::Object:
      return "an object";
    case Want::StringObject:
      return "an object of strings";
    case Want::NumberObject:
      return "an object of numbers";
  }
  return "";
}

bool all_of(const json& v, bool (json::*is)() const noexcept) {
  for (const auto& x : v) {
    if (!(x.*is)()) return false;
  }
  return true;
}

bool matches(const json& v, Want w) {
  switch (w) {
    case Want::Integer:
      return (v.is_number_unsigned() && v.get<std::uint64_t>() <= std::uint64_t(INT64_MAX)) ||
             (v.is_number_integer() && v.get<std::int64_t>() >= 0);
    case Want::Number:
      return v.is_number();
    case Want::NumberOrNull:
      return v.is_number() || v.is_null();
    case Want::String:
      return v.is_string();
    case Want::Bool:
      return v.is_boolean();
    case Want::StringArray:
      return v.is_array() && all_of(v, &json::is_string);
    case Want::Array:
      return v.is_array();
    case Want::Object:
      return v.is_object();
    case Want::StringObject:
      return v.is_object() && all_of(v, &json::is_string);
    case Want::NumberObject:
      return v.is_object() && all_of(v, &json::is_number);
  }
  return false;
}

/// The checks of one record, each problem "<path>:<line>: a "<event>" record: ...".
class RecordCheck {
 public:
  RecordCheck(const json& record, std::string where, std::vector<std::string>& problems)
      : r_(record), where_(std::move(where)), problems_(problems) {}

  /// A field the record must have, of type `w`. False when it is not there as it must be.
  bool need(const char* field, Want w) {
    if (!r_.contains(field)) {
      fail(std::string("\"") + field + "\" is missing (" + want_text(w) + ")");
      return false;
    }
    return may(field, w);
  }
  /// A field an earlier trainer may not have written: checked when it is there.
  bool may(const char* field, Want w) {
    if (!r_.contains(field) || matches(r_[field], w)) return true;
    fail(std::string("\"") + field + "\" must be " + want_text(w) + ", not " + shown(r_[field]));
    return false;
  }
  void fail(const std::string& what) {
    problems_.push_back(where_ + what);
    ok_ = false;
  }
  bool ok() const { return ok_; }

 private:
  const json& r_;
  std::string where_;
  std::vector<std::string>& problems_;
  bool ok_ = true;
};

/// A trial's point as the space can use it: each of its parameters with its value text (a
/// choice: one of the values; else a number) and its internal number (finite; a choice: the
/// index of a value). Parameters of another space are left to the space's comparison.
void check_point(const json& params, const json& internal, const SearchSpace& space, RecordCheck& c) {
  for (const auto& p : space.params()) {
    if (!params.contains(p.key)) continue;
    const std::string text = params[p.key].get<std::string>();
    if (!internal.contains(p.key) || !std::isfinite(internal[p.key].get<double>())) {
      c.fail("\"internal\" needs a finite number for \"" + p.key + "\"");
      continue;
    }
    const double x = internal[p.key].get<double>();
    if (p.kind == SearchParam::Kind::Choice) {
      std::set<std::string> values(p.range.values.begin(), p.range.values.end());
      std::size_t most = p.range.values.size();
      for (const auto& [k, r] : p.cases) {
        values.insert(r.values.begin(), r.values.end());
        most = std::max(most, r.values.size());
      }
      if (!values.count(text)) c.fail("\"params\": " + p.key + " = " + shown(params[p.key]) + " is none of its values");
      if (x < 0 || x != std::floor(x) || x >= double(most)) {
        c.fail("\"internal\": " + p.key + " = " + shown(internal[p.key]) + " is not the index of one of its values");
      }
    } else {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !std::isfinite(v)) {
        c.fail("\"params\": " + p.key + " = " + shown(params[p.key]) + " is not a number");
      }
    }
  }
}

}  // namespace

Replayed replay(const std::vector<JournalLine>& lines, const SearchSpace& space, const std::string& path) {
  Replayed out;
  std::vector<std::string> problems;
  const json this_space = space_record(space);
  bool first = true;
  for (const auto& l : lines) {
    const std::string at = path + ":" + std::to_string(l.line) + ": ";
    if (!l.parse_error.empty()) {
      problems.push_back(at + "not a JSON record (" + l.parse_error + ")");
      first = false;
      continue;
    }
    const json& j = l.record;
    if (!j.is_object()) {
      problems.push_back(at + "a record is a JSON object, not " + shown(j));
      first = false;
      continue;
    }
    if (!j.contains("event") || !j["event"].is_string()) {
      problems.push_back(at + "\"event\" is " +
                         (j.contains("event") ? "not a string: " + shown(j["event"]) : "missing") +
                         " (one of study, mlflow, trial, report, end)");
      first = false;
      continue;
    }
    const std::string ev = j["event"].get<std::string>();
    if (ev != "study" && ev != "mlflow" && ev != "trial" && ev != "report" && ev != "end") {
      problems.push_back(at + "unknown event " + shown(j["event"]) + " (one of study, mlflow, trial, report, end)");
      first = false;
      continue;
    }
    RecordCheck c(j, at + "\"" + ev + "\" record: ", problems);
    if (first && ev != "study") {
      c.fail("the journal's first record must be the study's (\"event\":\"study\")");
      first = false;
      continue;
    }
    first = false;
    if (ev == "study") {
      for (const char* k : {"objective", "direction", "sampler"}) c.need(k, Want::String);
      for (const char* k : {"seed", "n_trials"}) c.need(k, Want::Integer);
      c.need("recipe", Want::String);
      c.need("overrides", Want::StringArray);
      const bool current = j.contains("version");
      if (current) {
        c.need("version", Want::Integer);
        c.need("config_hash", Want::String);
        c.need("config", Want::StringObject);
        c.need("settings", Want::Object);
        c.need("space", Want::Array);
      } else {
        c.may("space", Want::Array);
      }
      if (c.ok()) out.study = j;
    } else if (ev == "mlflow") {
      c.need("run_id", Want::String);
      c.need("tracking_uri", Want::String);
      if (c.ok()) out.mlflow = {j["run_id"].get<std::string>(), j["tracking_uri"].get<std::string>()};
    } else if (ev == "trial") {
      c.need("number", Want::Integer);
      c.need("params", Want::StringObject);
      c.need("internal", Want::NumberObject);
      if (!c.ok()) continue;
      // Against another space the resume is refused anyway, naming the difference.
      if (!out.study.contains("space") || out.study["space"] == this_space) {
        check_point(j["params"], j["internal"], space, c);
      }
      if (!c.ok()) continue;
      TrialRecord t;
      t.number = j["number"].get<std::int64_t>();
      t.state = TrialState::Running;
      t.params = params_from(j, space);
      out.trials[t.number] = t;
    } else {  // report, end
      if (!c.need("number", Want::Integer)) continue;
      const auto n = j["number"].get<std::int64_t>();
      if (!out.trials.count(n)) {
        c.fail("trial " + std::to_string(n) + " has no \"trial\" record before it");
        continue;
      }
      if (ev == "report") {
        if (c.need("value", Want::Number)) out.trials[n].intermediate.push_back(j["value"].get<double>());
        continue;
      }
      std::optional<TrialState> state;
      if (c.need("state", Want::String)) {
        state = trial_state_named(j["state"].get<std::string>());
        if (!state || !trial_ended(*state)) {
          c.fail("\"state\" must be one of COMPLETE, PRUNED, FAILED, SKIPPED, not " + shown(j["state"]));
        }
      }
      c.may("reason", Want::String);
      c.may("run_dir", Want::String);
      c.may("seconds", Want::Number);
      c.may("out_of_memory", Want::Bool);
      c.may("value_not_finite", Want::Bool);
      c.may("oom", Want::StringObject);
      c.may("value", Want::NumberOrNull);
      if (j.contains("predicted_peak") &&
          !(j["predicted_peak"].is_number_integer() && j["predicted_peak"].get<std::int64_t>() >= -1)) {
        c.fail("\"predicted_peak\" must be an integer >= -1 (bytes; -1: not estimated), not " +
               shown(j["predicted_peak"]));
      }
      if (!c.ok()) continue;
      TrialRecord& t = out.trials[n];
      t.state = *state;
      t.reason = j.value("reason", "");
      t.seconds = j.value("seconds", 0.0);
      t.out_of_memory = j.value("out_of_memory", false);
      t.diverged = j.value("value_not_finite", false);
      t.predicted_peak = j.value("predicted_peak", std::int64_t{-1});
      t.run_dir = j.value("run_dir", "");
      t.value.reset();
      if (j.contains("value") && j["value"].is_number()) t.value = j["value"].get<double>();
      t.oom.clear();
      if (j.contains("oom")) {
        for (const auto& [k, v] : j["oom"].items()) t.oom[k] = v.get<std::string>();
      }
    }
  }
  if (!problems.empty()) {
    throw UsageError(path + " is not a study journal trainer sweep can resume from:\n  " +
                     fmt::to_string(fmt::join(problems, "\n  ")) +
                     "\nit was changed or written by something else: mend or remove those lines, or give another "
                     "--study-dir");
  }
  for (auto& [n, t] : out.trials) {
    if (t.state == TrialState::Running) {
      t.intermediate.clear();
    } else {
      ++out.ended;
    }
  }
  return out;
}

}  // namespace trainer::tune
