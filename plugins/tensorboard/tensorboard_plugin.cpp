// tensorboard: every metric the run logs, as TensorBoard event files (scalars with their step
// and wall time), and the run's config as hyper-parameters for TensorBoard's HParams
// dashboard, with the run's end status. Written with Protocol Buffers from TensorBoard's own
// .proto definitions (proto/), framed as TFRecords. A resumed run starts a new event file
// with a SessionLog START after the step it resumed from, so TensorBoard drops the steps an
// earlier file had after it (a run resumed in place from an earlier checkpoint).
#include <google/protobuf/struct.pb.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>

#include "event_file.h"
#include "tensorboard/compat/proto/event.pb.h"
#include "tensorboard/plugins/hparams/plugin_data.pb.h"
#include "trainer/config.h"
#include "trainer/distributed.h"
#include "trainer/error.h"
#include "trainer/metrics.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"

namespace {

namespace tb = ::tensorboard;
namespace fs = std::filesystem;

struct TensorboardSettings : trainer::Settings<TensorboardSettings> {
  std::string log_dir;
  bool hparams = true;

  static void declare(trainer::SettingsSchema<TensorboardSettings>& s) {
    s.add(&TensorboardSettings::log_dir, "log_dir",
          "Directory of the event files; empty = <run_dir>/tensorboard (tensorboard --logdir runs/ shows every run)");
    s.add(&TensorboardSettings::hparams, "hparams",
          "Write the run's config as hyper-parameters (HParams dashboard) and its end status");
  }
};

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

/// Writes Events into one event file; the sink and the plugin share it.
class Writer {
 public:
  explicit Writer(const std::string& dir) : file_(dir) {
    tb::Event e;
    e.set_wall_time(now_s());
    e.set_file_version("brain.Event:2");
    e.mutable_source_metadata()->set_writer("trainer");
    write(e);
  }
  void write(const tb::Event& e) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string bytes;
    TRAINER_CHECK(e.SerializeToString(&bytes), "tensorboard: cannot serialize an event");
    TRAINER_CHECK(file_.write_record(bytes) && file_.flush(), "tensorboard: cannot write ", file_.path(), ": ",
                  std::strerror(errno));
  }
  const std::string& path() const { return file_.path(); }

 private:
  std::mutex mu_;
  trainer::tensorboard::EventFile file_;
};

/// An HParams plugin summary (session start or end) at step 0.
tb::Event hparams_event(const char* tag, const tb::hparams::HParamsPluginData& data) {
  tb::Event e;
  e.set_wall_time(now_s());
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* plugin = v->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name("hparams");
  plugin->set_content(data.SerializeAsString());
  return e;
}

/// Scalars: one Event per run of points logged together (one step, one time).
class Sink final : public trainer::MetricSink {
 public:
  Sink(std::shared_ptr<Writer> writer, bool hparams) : writer_(std::move(writer)), hparams_(hparams) {}
  void write(const std::vector<trainer::MetricPoint>& points) override {
    // A group is one step; its points may have been logged at different times (the training
    // metrics, then the evaluation's): one Event per run of points with the same time and step.
    for (std::size_t i = 0; i < points.size();) {
      tb::Event e;
      e.set_wall_time(points[i].time);
      e.set_step(points[i].step);
      for (; i < points.size() && points[i].time == e.wall_time() && points[i].step == e.step(); ++i) {
        auto* v = e.mutable_summary()->add_value();
        v->set_tag(points[i].name);
        v->set_simple_value(static_cast<float>(points[i].value));
      }
      writer_->write(e);
    }
  }
  void close(const std::string& status) override {
    if (!hparams_) return;
    tb::hparams::HParamsPluginData d;
    d.set_version(0);
    auto* end = d.mutable_session_end_info();
    end->set_status(status == "FINISHED" ? tb::hparams::STATUS_SUCCESS
                    : status == "FAILED" ? tb::hparams::STATUS_FAILURE
                                         : tb::hparams::STATUS_UNKNOWN);  // KILLED: stopped, not failed
    end->set_end_time_secs(now_s());
    writer_->write(hparams_event("_hparams_/session_end_info", d));
  }

 private:
  std::shared_ptr<Writer> writer_;
  bool hparams_;
};

class TensorboardPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "tensorboard"; }
  std::string description() const override {
    return "Metrics as TensorBoard event files (scalars), the config as hyper-parameters: tensorboard --logdir runs/";
  }
  std::vector<trainer::Event> events() const override { return {trainer::Event::Init, trainer::Event::Resume}; }
  std::vector<trainer::KeySpec> config_keys() const override { return TensorboardSettings::keys(); }
  // A run asked to be seen in TensorBoard is not trained unseen: a directory that cannot be
  // written fails the start.
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = TensorboardSettings::from(section);
  }

  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (trainer::rank_of_this_process() != 0) return;  // one run, one set of event files: rank 0's
    if (ctx.event == trainer::Event::Init) {
      const std::string dir = s_.log_dir.empty() ? (fs::path(ctx.run_dir) / "tensorboard").string() : s_.log_dir;
      writer_ = std::make_shared<Writer>(dir);
      if (s_.hparams) write_session_start(*ctx.config);
      ctx.metrics->add_sink(std::make_shared<Sink>(writer_, s_.hparams));
      logger_->info("tensorboard: writing {} (tensorboard --logdir {})", writer_->path(), dir);
    } else if (ctx.event == trainer::Event::Resume && writer_) {
      // TensorBoard drops what earlier files hold from this step on: the steps after the one
      // resumed from, which this run trains again.
      tb::Event e;
      e.set_wall_time(now_s());
      e.set_step(ctx.state.global_step + 1);
      e.mutable_session_log()->set_status(tb::SessionLog::START);
      writer_->write(e);
    }
  }

 private:
  void write_session_start(const trainer::Config& config) {
    tb::hparams::HParamsPluginData d;
    d.set_version(0);
    auto* start = d.mutable_session_start_info();
    start->set_start_time_secs(now_s());
    auto& hp = *start->mutable_hparams();
    for (const auto& key : config.leaf_keys()) {
      const trainer::ConfigValue& v = config.value(key);
      google::protobuf::Value value;
      if (const auto* i = std::get_if<std::int64_t>(&v)) {
        value.set_number_value(static_cast<double>(*i));
      } else if (const auto* f = std::get_if<double>(&v)) {
        value.set_number_value(*f);
      } else if (const auto* b = std::get_if<bool>(&v)) {
        value.set_bool_value(*b);
      } else if (const auto* s = std::get_if<std::string>(&v)) {
        value.set_string_value(*s);
      } else {
        value.set_string_value(trainer::config_value_to_toml(v));  // a list, as written in TOML
      }
      hp[key] = value;
    }
    writer_->write(hparams_event("_hparams_/session_start_info", d));
  }

  TensorboardSettings s_;
  std::shared_ptr<Writer> writer_;
};

}  // namespace

TRAINER_PLUGIN(TensorboardPlugin)
