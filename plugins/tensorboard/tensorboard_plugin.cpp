// tensorboard: every metric the run logs, as TensorBoard event files (scalars with their step
// and wall time), and the run's config as hyper-parameters for TensorBoard's HParams
// dashboard, with the run's end status. Written with Protocol Buffers from TensorBoard's own
// .proto definitions (proto/; events.cpp), framed as TFRecords. A resumed run starts a new event file
// with a SessionLog START after the step it resumed from, so TensorBoard drops the steps an
// earlier file had after it (a run resumed in place from an earlier checkpoint).
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>

#include "event_file.h"
#include "events.h"
#include "trainer/config.h"
#include "trainer/distributed.h"
#include "trainer/durable_file.h"
#include "trainer/error.h"
#include "trainer/metrics.h"
#include "trainer/plugin.h"
#include "trainer/secrets.h"
#include "trainer/settings.h"

namespace {

namespace tb = trainer::tensorboard;
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

/// Writes serialized Events into one event file; the sink and the plugin share it.
class Writer {
 public:
  explicit Writer(const std::string& dir) : file_(dir) { write(tb::file_version_event(now_s())); }
  void write(const std::string& event) {
    std::lock_guard<std::mutex> lock(mu_);
    TRAINER_CHECK(file_.write_record(event) && file_.flush(), "tensorboard: cannot write ", file_.path(), ": ",
                  std::strerror(errno));
  }
  const std::string& path() const { return file_.path(); }

 private:
  std::mutex mu_;
  tb::EventFile file_;
};

/// Scalars: one Event per run of points logged together (one step, one time).
class Sink final : public trainer::MetricSink {
 public:
  Sink(std::shared_ptr<Writer> writer, bool hparams) : writer_(std::move(writer)), hparams_(hparams) {}
  void write(const std::vector<trainer::MetricPoint>& points) override {
    // A group is one step; its points may have been logged at different times (the training
    // metrics, then the evaluation's): one Event per run of points with the same time and step.
    for (std::size_t i = 0; i < points.size();) {
      const double time = points[i].time;
      const std::int64_t step = points[i].step;
      std::vector<std::pair<std::string, float>> values;
      for (; i < points.size() && points[i].time == time && points[i].step == step; ++i) {
        values.emplace_back(points[i].name, static_cast<float>(points[i].value));
      }
      writer_->write(tb::scalars_event(time, step, values));
    }
  }
  void close(const std::string& status) override {
    if (!hparams_) return;
    writer_->write(tb::hparams_end_event(now_s(), status == "FINISHED" ? tb::SessionStatus::Success
                                                  : status == "FAILED"
                                                      ? tb::SessionStatus::Failure
                                                      : tb::SessionStatus::Unknown));  // KILLED: stopped, not failed
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
      // The run directory's tensorboard/ is its own: a link there is refused (exit 2), not followed.
      if (s_.log_dir.empty()) trainer::make_run_subdir(dir);
      writer_ = std::make_shared<Writer>(dir);
      if (s_.hparams) write_session_start(trainer::redacted(*ctx.config));  // no secrets
      ctx.metrics->add_sink(std::make_shared<Sink>(writer_, s_.hparams));
      logger_->info("tensorboard: writing {} (tensorboard --logdir {})", writer_->path(), dir);
    } else if (ctx.event == trainer::Event::Resume && writer_) {
      // TensorBoard drops what earlier files hold from this step on: the steps after the one
      // resumed from, which this run trains again.
      writer_->write(tb::session_start_event(now_s(), ctx.state.global_step + 1));
    }
  }

 private:
  void write_session_start(const trainer::Config& config) {
    std::vector<std::pair<std::string, tb::HParamValue>> hparams;
    for (const auto& key : config.leaf_keys()) {
      const trainer::ConfigValue& v = config.value(key);
      if (const auto* i = std::get_if<std::int64_t>(&v)) {
        hparams.emplace_back(key, static_cast<double>(*i));
      } else if (const auto* f = std::get_if<double>(&v)) {
        hparams.emplace_back(key, *f);
      } else if (const auto* b = std::get_if<bool>(&v)) {
        hparams.emplace_back(key, *b);
      } else if (const auto* s = std::get_if<std::string>(&v)) {
        hparams.emplace_back(key, *s);
      } else {
        hparams.emplace_back(key, trainer::config_value_to_toml(v));  // a list, as written in TOML
      }
    }
    writer_->write(tb::hparams_start_event(now_s(), hparams));
  }

  TensorboardSettings s_;
  std::shared_ptr<Writer> writer_;
};

}  // namespace

TRAINER_PLUGIN(TensorboardPlugin)
