#include "journal_check.h"

#include <string>

#include "backends.h"
#include "mlflow_client.h"
#include "trainer/json.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainer::mlflow {

namespace {

/// `j` for a message: its JSON, cut at 80 characters.
std::string shown(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

[[noreturn]] void refuse(const std::string& where, const std::string& what) { throw JournalError(where + ": " + what); }

const std::string kKeyRule = "1-" + std::to_string(kMaxKeyLength) +
                             " characters of letters, digits, _ - . space : /, a path without empty, . or .. parts";

void check_key(const json& k, const char* what, const std::string& where) {
  if (!k.is_string()) refuse(where, std::string(what) + " key " + shown(k) + " is not a string");
  const std::string key = k.get<std::string>();
  if (!valid_key(key)) {
    refuse(where, std::string(what) + " key '" + key + "' is not valid in MLflow (" + kKeyRule +
                      "; the plugin logs such a key under a valid name)");
  }
}

/// [[key, value], ...]: params or tags.
void check_key_values(const json& rec, const char* field, const char* what, std::size_t max_count,
                      std::size_t max_value, const std::string& where) {
  if (!rec.contains(field)) return;
  const json& a = rec[field];
  if (!a.is_array()) refuse(where, std::string(field) + " is not an array of [key, value]");
  if (a.size() > max_count) {
    refuse(where, std::string(field) + " holds " + std::to_string(a.size()) +
                      " entries, not valid in MLflow (at most " + std::to_string(max_count) + " per request)");
  }
  for (const auto& kv : a) {
    if (!kv.is_array() || kv.size() != 2) refuse(where, std::string(what) + " " + shown(kv) + " is not [key, value]");
    check_key(kv[0], what, where);
    if (!kv[1].is_string())
      refuse(where, std::string(what) + " '" + kv[0].get<std::string>() + "' has no string value");
    const std::size_t n = kv[1].get_ref<const std::string&>().size();
    if (n > max_value) {
      refuse(where, std::string(what) + " '" + kv[0].get<std::string>() + "' has a value of " + std::to_string(n) +
                        " characters, not valid in MLflow (at most " + std::to_string(max_value) +
                        "; the plugin cuts longer values)");
    }
  }
}

void check_string(const json& rec, const char* field, bool required, const std::string& where) {
  if (!rec.contains(field)) {
    if (required) refuse(where, std::string("the ") + rec.value("op", std::string()) + " record has no " + field);
    return;
  }
  if (!rec[field].is_string()) refuse(where, std::string(field) + " " + shown(rec[field]) + " is not a string");
}

void check_integer(const json& rec, const char* field, const std::string& where) {
  if (rec.contains(field) && !rec[field].is_number_integer()) {
    refuse(where, std::string(field) + " " + shown(rec[field]) + " is not an integer");
  }
}

}  // namespace

void validate_record(const json& rec, const std::string& where) {
  if (!rec.is_object()) refuse(where, "not a journal record (a JSON object)");
  if (!rec.contains("op") || !rec["op"].is_string()) refuse(where, "a journal record without an op");
  const std::string op = rec["op"].get<std::string>();
  check_integer(rec, "seq", where);
  if (op == "start" || op == "continue") {
    check_string(rec, "experiment", true, where);
    if (rec["experiment"].get_ref<const std::string&>().empty()) refuse(where, "the experiment name is empty");
    for (const char* f : {"tracking_uri", "run_name", "user", "journal_id"}) check_string(rec, f, false, where);
    for (const char* f : {"run_name", "user"}) {
      if (rec.contains(f) && rec[f].get_ref<const std::string&>().size() > kMaxTagValueLength) {
        refuse(where, std::string(f) + " is longer than " + std::to_string(kMaxTagValueLength) + " characters");
      }
    }
    if (rec.contains("journal_id") && !valid_id(rec["journal_id"].get<std::string>())) {
      refuse(where, "journal_id " + shown(rec["journal_id"]) + " is not 1-64 letters, digits, _ or -");
    }
    check_integer(rec, "start_time", where);
    check_key_values(rec, "tags", "tag", kMaxEntitiesPerBatch, kMaxTagValueLength, where);
    if (op == "continue") {
      check_string(rec, "previous_run_dir", true, where);
      if (!fs::path(rec["previous_run_dir"].get<std::string>()).is_absolute()) {
        refuse(where, "previous_run_dir " + shown(rec["previous_run_dir"]) + " is not an absolute path");
      }
    }
  } else if (op == "batch") {
    if (rec.contains("metrics")) {
      const json& ms = rec["metrics"];
      if (!ms.is_array()) refuse(where, "metrics is not an array of [key, value, timestamp, step]");
      if (ms.size() > kMaxMetricsPerBatch) {
        refuse(where, "metrics holds " + std::to_string(ms.size()) + " points, not valid in MLflow (at most " +
                          std::to_string(kMaxMetricsPerBatch) + " per request)");
      }
      for (const auto& m : ms) {
        if (!m.is_array() || m.size() != 4)
          refuse(where, "metric " + shown(m) + " is not [key, value, timestamp, step]");
        check_key(m[0], "metric", where);
        const bool special = m[1].is_string() && json_nonfinite_value(m[1].get_ref<const std::string&>());
        if (!m[1].is_number() && !special) {
          refuse(where, "metric '" + m[0].get<std::string>() + "' has the value " + shown(m[1]) +
                            ": a number, \"NaN\", \"Infinity\" or \"-Infinity\" is allowed");
        }
        if (!m[2].is_number_integer() || !m[3].is_number_integer()) {
          refuse(where, "metric '" + m[0].get<std::string>() + "': timestamp and step must be integers");
        }
      }
    }
    check_key_values(rec, "params", "param", kMaxParamsTagsPerBatch, kMaxParamValueLength, where);
    check_key_values(rec, "tags", "tag", kMaxParamsTagsPerBatch, kMaxTagValueLength, where);
  } else if (op == "artifact") {
    check_string(rec, "file", true, where);
    check_string(rec, "path", true, where);
    if (rec["file"].get_ref<const std::string&>().empty()) refuse(where, "the artifact record names no file");
    const std::string path = rec["path"].get<std::string>();
    if (!valid_artifact_path(path)) {
      refuse(where, "artifact path '" + path +
                        "' is not valid: a relative path of /-separated parts, none empty, . or .., at most " +
                        std::to_string(kMaxArtifactPathLength) + " characters");
    }
  } else if (op == "end") {
    check_string(rec, "status", true, where);
    const std::string status = rec["status"].get<std::string>();
    if (status != "FINISHED" && status != "FAILED" && status != "KILLED") {
      refuse(where, "status '" + status + "' is not FINISHED, FAILED or KILLED");
    }
    check_integer(rec, "end_time", where);
  } else {
    refuse(where, "unknown journal record '" + op + "' (start, continue, batch, artifact and end are written)");
  }
}

fs::path artifact_source(const fs::path& run_dir, const std::string& file, const std::string& where) {
  const fs::path base = fs::weakly_canonical(fs::absolute(run_dir));
  fs::path p = file;
  if (p.is_relative()) p = base / p;
  const fs::path real = fs::weakly_canonical(p);
  if (!detail::is_within(real, base) || real == base) {
    refuse(where, "artifact file '" + file + "' leads to " + real.string() +
                      ": an artifact's file must lie inside the run directory " + base.string());
  }
  return real;
}

}  // namespace trainer::mlflow
