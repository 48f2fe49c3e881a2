// The tensorboard.Event messages, built with the code protoc generated from TensorBoard's own
// .proto definitions (proto/) and serialized. This is the plugin's only file that includes
// Protocol Buffers headers; it includes no LibTorch header (events.h says why).
#include "events.h"

#include <google/protobuf/struct.pb.h>

#include <stdexcept>

#include "tensorboard/compat/proto/event.pb.h"
#include "tensorboard/plugins/hparams/plugin_data.pb.h"

namespace trainer::tensorboard {
namespace {

namespace tb = ::tensorboard;

std::string serialized(const tb::Event& e) {
  std::string bytes;
  if (!e.SerializeToString(&bytes)) throw std::runtime_error("tensorboard: cannot serialize an event");
  return bytes;
}

/// An HParams plugin summary (session start or end) at step 0.
std::string hparams_event(double wall_time, const char* tag, const tb::hparams::HParamsPluginData& data) {
  tb::Event e;
  e.set_wall_time(wall_time);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* plugin = v->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name("hparams");
  plugin->set_content(data.SerializeAsString());
  return serialized(e);
}

}  // namespace

std::string file_version_event(double wall_time) {
  tb::Event e;
  e.set_wall_time(wall_time);
  e.set_file_version("brain.Event:2");
  e.mutable_source_metadata()->set_writer("trainer");
  return serialized(e);
}

std::string scalars_event(double wall_time, std::int64_t step,
                          const std::vector<std::pair<std::string, float>>& values) {
  tb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  for (const auto& [tag, value] : values) {
    auto* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(value);
  }
  return serialized(e);
}

std::string session_start_event(double wall_time, std::int64_t step) {
  tb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  e.mutable_session_log()->set_status(tb::SessionLog::START);
  return serialized(e);
}

std::string hparams_start_event(double wall_time, const std::vector<std::pair<std::string, HParamValue>>& hparams) {
  tb::hparams::HParamsPluginData d;
  d.set_version(0);
  auto* start = d.mutable_session_start_info();
  start->set_start_time_secs(wall_time);
  auto& hp = *start->mutable_hparams();
  for (const auto& [key, v] : hparams) {
    google::protobuf::Value value;
    if (const auto* n = std::get_if<double>(&v)) {
      value.set_number_value(*n);
    } else if (const auto* b = std::get_if<bool>(&v)) {
      value.set_bool_value(*b);
    } else {
      value.set_string_value(std::get<std::string>(v));
    }
    hp[key] = value;
  }
  return hparams_event(wall_time, "_hparams_/session_start_info", d);
}

std::string hparams_end_event(double wall_time, SessionStatus status) {
  tb::hparams::HParamsPluginData d;
  d.set_version(0);
  auto* end = d.mutable_session_end_info();
  end->set_status(status == SessionStatus::Success   ? tb::hparams::STATUS_SUCCESS
                  : status == SessionStatus::Failure ? tb::hparams::STATUS_FAILURE
                                                     : tb::hparams::STATUS_UNKNOWN);
  end->set_end_time_secs(wall_time);
  return hparams_event(wall_time, "_hparams_/session_end_info", d);
}

}  // namespace trainer::tensorboard
