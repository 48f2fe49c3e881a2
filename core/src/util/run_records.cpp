#include "trainer/run_records.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>

#include "trainer/error.h"
#include "trainer/json.h"
#include "trainer/secrets.h"

namespace trainer {

namespace {

using ordered = nlohmann::ordered_json;
using json = nlohmann::json;

/// The integer `key` of `j` as T (a fraction dropped), or `fallback` when it is missing, not a
/// number or out of T's range.
template <class T>
T integer_of(const json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return fallback;
  if (it->is_number_unsigned()) {
    const auto v = it->get<std::uint64_t>();
    return v <= std::uint64_t(std::numeric_limits<T>::max()) ? T(v) : fallback;
  }
  if (it->is_number_integer()) {
    const auto v = it->get<std::int64_t>();
    return v >= std::int64_t(std::numeric_limits<T>::min()) && v <= std::int64_t(std::numeric_limits<T>::max())
               ? T(v)
               : fallback;
  }
  const double v = it->get<double>();
  // A double converted to an integer it cannot hold is undefined behaviour: check the range first.
  return v >= double(std::numeric_limits<T>::min()) && v < -double(std::numeric_limits<T>::min()) ? T(v) : fallback;
}

std::string text_of(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::string encode_status(const RunStatusRecord& s) {
  ordered j;
  j["status"] = run_status_name(s.status);
  j["exit_code"] = s.status == RunStatus::Running ? ordered(nullptr) : ordered(s.exit_code);
  j["global_step"] = s.global_step;
  j["epoch"] = s.epoch;
  // A message may quote a URI the user gave: its credentials are not written (trainer/secrets.h).
  j["message"] = without_userinfo(s.message);
  j["last_checkpoint"] = s.last_checkpoint;
  if (!s.stopped_by.empty()) {
    j["stopped_by"] = s.stopped_by;
    j["reason"] = without_userinfo(s.reason);
  }
  if (s.status == RunStatus::Failed) {
    j["failure"] = failure_kind_name(s.failure);
    if (s.oom_phase) j["phase"] = oom_phase_name(*s.oom_phase);
    if (s.failure == FailureKind::OutOfMemory && s.micro_batch > 0) j["micro_batch"] = s.micro_batch;
  }
  if (s.checkpointed_blocks > 0) j["checkpointed_blocks"] = s.checkpointed_blocks;
  if (s.optimizer_moment_bits > 0) j["optimizer_moment_bits"] = s.optimizer_moment_bits;
  if (s.optimizer_offload) j["optimizer_offload"] = true;
  if (s.skipped_steps > 0) {
    j["skipped_steps"] = s.skipped_steps;
    j["skipped_in_a_row"] = s.skipped_in_a_row;
  }
  if (std::isfinite(s.time)) j["time"] = s.time;
  // Invalid UTF-8 in a message (an OS error's text) is replaced, not thrown.
  return j.dump(-1, ' ', false, ordered::error_handler_t::replace) + "\n";
}

RunStatusRecord decode_status(std::string_view text) {
  const std::string owned(text);
  const json j = json_nesting(owned) > 64 ? json(json::value_t::discarded) : json::parse(owned, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error("is not a JSON object");
  const auto status = j.find("status");
  if (status == j.end() || !status->is_string()) throw Error("has no \"status\" string");
  RunStatusRecord s;
  const auto named = run_status_named(status->get<std::string>());
  if (!named) {
    throw Error("has \"status\" \"" + status->get<std::string>() +
                "\", which is not one of RUNNING, FINISHED, FAILED, KILLED");
  }
  s.status = *named;
  s.exit_code = integer_of(j, "exit_code", 0);
  s.global_step = integer_of<std::int64_t>(j, "global_step", 0);
  s.epoch = integer_of<std::int64_t>(j, "epoch", 0);
  s.message = text_of(j, "message");
  s.last_checkpoint = text_of(j, "last_checkpoint");
  s.stopped_by = text_of(j, "stopped_by");
  s.reason = text_of(j, "reason");
  if (const auto kind = failure_kind_named(text_of(j, "failure"))) s.failure = *kind;
  s.oom_phase = oom_phase_named(text_of(j, "phase"));
  s.micro_batch = std::max<std::int64_t>(integer_of<std::int64_t>(j, "micro_batch", 0), 0);
  s.checkpointed_blocks = std::max<std::int64_t>(integer_of<std::int64_t>(j, "checkpointed_blocks", 0), 0);
  const int bits = integer_of(j, "optimizer_moment_bits", 0);
  s.optimizer_moment_bits = bits == 32 || bits == 16 || bits == 8 ? bits : 0;
  const auto offload = j.find("optimizer_offload");
  s.optimizer_offload = offload != j.end() && offload->is_boolean() && offload->get<bool>();
  s.skipped_steps = std::max<std::int64_t>(integer_of<std::int64_t>(j, "skipped_steps", 0), 0);
  s.skipped_in_a_row = std::clamp<std::int64_t>(integer_of<std::int64_t>(j, "skipped_in_a_row", 0), 0, s.skipped_steps);
  const auto time = j.find("time");
  if (time != j.end() && time->is_number()) s.time = time->get<double>();
  return s;
}

std::string encode_metric(const MetricRecord& m) {
  std::string line = "{\"step\":" + std::to_string(m.step) + ",\"name\":" + json_quote(m.name) +
                     ",\"value\":" + json_number(m.value) + ",\"time\":" + json_number(m.time);
  return line + "}\n";
}

std::optional<MetricRecord> decode_metric(std::string_view line) {
  // Metric lines are flat objects: one that nests deeper is not one, and is not parsed (the
  // parser recurses).
  const std::string owned(line);
  if (json_nesting(owned) > 8) return std::nullopt;
  const json j = json::parse(owned, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  const auto step = j.find("step"), name = j.find("name"), value = j.find("value"), time = j.find("time");
  if (step == j.end() || !step->is_number() || name == j.end() || !name->is_string() || value == j.end()) {
    return std::nullopt;
  }
  // A step is a whole number (a fraction would fold two steps into one): 7.0 from Python's
  // json module is one, 7.5 is not.
  if (step->is_number_float() && std::floor(step->get<double>()) != step->get<double>()) return std::nullopt;
  MetricRecord m;
  constexpr auto kNone = std::numeric_limits<std::int64_t>::min();
  m.step = integer_of<std::int64_t>(j, "step", kNone);
  if (m.step == kNone) return std::nullopt;
  m.name = name->get<std::string>();
  if (m.name.empty()) return std::nullopt;
  if (value->is_number()) {
    m.value = value->get<double>();
  } else if (value->is_string()) {
    const auto v = json_nonfinite_value(value->get_ref<const std::string&>());
    if (!v) return std::nullopt;
    m.value = *v;
  } else {
    return std::nullopt;
  }
  m.time = time != j.end() && time->is_number() ? time->get<double>() : NAN;
  return m;
}

std::string encode_digest(const CheckpointDigest& d) {
  char text[64];
  std::snprintf(text, sizeof text, "size %" PRId64 " crc32 %08" PRIx32 "\n", d.size, d.crc32);
  return text;
}

std::optional<CheckpointDigest> decode_digest(std::string_view text) {
  const std::string line(text.substr(0, std::min(text.find('\n'), std::size_t(64))));
  std::int64_t size = -1;
  std::uint32_t crc = 0;
  if (std::sscanf(line.c_str(), "size %" SCNd64 " crc32 %" SCNx32, &size, &crc) != 2 || size < 0) return std::nullopt;
  return CheckpointDigest{size, crc};
}

}  // namespace trainer
