#pragma once
// The tensorboard.Event messages the plugin writes, serialized. The Protocol Buffers code
// stays in this file's .cpp, compiled apart from LibTorch's headers: a pip torch ships protobuf
// headers of another version (3.13) that would shadow the ones protoc's code is generated for.
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace trainer::tensorboard {

/// The first event of a file: its version ("brain.Event:2") and the writer ("trainer").
std::string file_version_event(double wall_time);

/// Scalars logged at one step and time: (tag, value) each.
std::string scalars_event(double wall_time, std::int64_t step,
                          const std::vector<std::pair<std::string, float>>& values);

/// A SessionLog START at `step`: TensorBoard drops what earlier files hold from that step on.
std::string session_start_event(double wall_time, std::int64_t step);

/// A hyper-parameter's value: a number, a bool or a string.
using HParamValue = std::variant<double, bool, std::string>;

/// The HParams dashboard's session start (the run's hyper-parameters, by name) at step 0.
std::string hparams_start_event(double wall_time, const std::vector<std::pair<std::string, HParamValue>>& hparams);

/// The run's end as the HParams dashboard's session status.
enum class SessionStatus { Success, Failure, Unknown };
std::string hparams_end_event(double wall_time, SessionStatus status);

}  // namespace trainer::tensorboard
