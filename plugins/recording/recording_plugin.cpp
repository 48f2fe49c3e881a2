// recording: writes every event with a context snapshot as JSON lines (tests, debugging).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "trainer/distributed.h"
#include "trainer/durable_file.h"
#include "trainer/json.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"

namespace {

struct RecordingSettings : trainer::Settings<RecordingSettings> {
  std::string file;
  std::vector<std::string> events;
  bool indices = false;

  static void declare(trainer::SettingsSchema<RecordingSettings>& s) {
    s.add(&RecordingSettings::file, "file",
          "Output file; empty = <run_dir>/events.jsonl (on rank N of a data-parallel run: events-rankN.jsonl, or "
          "the file's name with -rankN after it)");
    std::vector<std::string> names;
    for (const auto e : trainer::all_events()) names.emplace_back(trainer::event_name(e));
    s.add(&RecordingSettings::events, "events", "Record only these events; empty = all").choices(names);
    s.add(&RecordingSettings::indices, "indices", "Also record the dataset indices of each micro-batch");
  }
};

class RecordingPlugin final : public trainer::Plugin {
 public:
  ~RecordingPlugin() override {
    if (out_) std::fclose(out_);
  }
  std::string name() const override { return "recording"; }
  std::string description() const override { return "Records every event and its context as JSON lines"; }
  // Only the events asked for (read after configure()): a plugin handling AfterBackward keeps a
  // data-parallel run from overlapping its all-reduce with the backward.
  std::vector<trainer::Event> events() const override { return only_.empty() ? trainer::all_events() : only_; }
  std::vector<trainer::KeySpec> config_keys() const override { return RecordingSettings::keys(); }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    const auto s = RecordingSettings::from(section);
    file_ = s.file;
    indices_ = s.indices;
    for (const auto& e : s.events) {
      const auto ev = trainer::event_from_name(e);
      if (!ev) throw trainer::ConfigError({"plugins.recording.events: unknown event '" + e + "'"});
      only_.push_back(*ev);
    }
  }

  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (!only_.empty() && std::find(only_.begin(), only_.end(), ctx.event) == only_.end()) return;
    if (!out_) {
      // Each rank of a data-parallel run records its own events.
      const std::int64_t rank = trainer::rank_of_this_process();
      const std::string suffix = rank == 0 ? "" : "-rank" + std::to_string(rank);
      const std::string path = file_.empty() ? ctx.run_dir + "/events" + suffix + ".jsonl" : file_ + suffix;
      // A file of its own, created new: never one a link planted at the name leads to.
      trainer::FileDescriptor fd = trainer::create_new_file(path);
      out_ = ::fdopen(fd.get(), "w");
      if (!out_) throw trainer::Error("recording: cannot open " + path);
      fd.release();
    }
    const auto& s = ctx.state;
    std::string line = "{\"seq\":" + std::to_string(seq_++) +
                       ",\"event\":" + trainer::json_quote(std::string(trainer::event_name(ctx.event))) +
                       ",\"epoch\":" + std::to_string(s.epoch) + ",\"global_step\":" + std::to_string(s.global_step) +
                       ",\"batch_in_epoch\":" + std::to_string(s.batch_in_epoch) +
                       ",\"micro_batch_index\":" + std::to_string(s.micro_batch_index) +
                       ",\"num_micro_batches\":" + std::to_string(s.num_micro_batches) +
                       ",\"micro_batch_size\":" + std::to_string(s.micro_batch_size) +
                       ",\"batch_size\":" + std::to_string(s.batch_size) +
                       ",\"samples_seen\":" + std::to_string(s.samples_seen) +
                       ",\"has_model\":" + (ctx.model ? "true" : "false") +
                       ",\"has_optimizer\":" + (ctx.optimizer ? "true" : "false") +
                       ",\"device\":" + trainer::json_quote(ctx.device.str());
    if (ctx.batch) line += ",\"samples\":" + std::to_string(ctx.batch->size());
    if (indices_ && ctx.indices && ctx.indices->defined()) {
      const at::Tensor idx = ctx.indices->to(at::kLong).contiguous();
      std::string list;
      for (std::int64_t i = 0; i < idx.numel(); ++i)
        list += (i ? "," : "") + std::to_string(idx.data_ptr<std::int64_t>()[i]);
      line += ",\"indices\":[" + list + "]";
    }
    if (ctx.loss && ctx.loss->defined()) line += ",\"loss\":" + trainer::json_number(ctx.loss->item<double>());
    if (ctx.event == trainer::Event::BatchEnd) line += ",\"batch_loss\":" + trainer::json_number(s.loss);
    if (ctx.eval_metrics) {
      for (const auto& kv : *ctx.eval_metrics)
        line += "," + trainer::json_quote(kv.first) + ":" + trainer::json_number(kv.second);
    }
    if (!ctx.checkpoint_path.empty() && ctx.event == trainer::Event::Checkpoint) {
      line += ",\"checkpoint\":" + trainer::json_quote(ctx.checkpoint_path);
    }
    if (ctx.event == trainer::Event::BeforeOptimizerStep) line += ",\"grad_norm\":" + trainer::json_number(s.grad_norm);
    if (ctx.resume) {
      std::string names;
      for (const auto& n : ctx.resume->restored_plugins) names += (names.empty() ? "" : ",") + trainer::json_quote(n);
      line += ",\"checkpoint\":" + trainer::json_quote(ctx.resume->checkpoint) + ",\"restored\":[" + names + "]";
    }
    if (ctx.status != trainer::RunStatus::Running) {
      line += ",\"status\":" + trainer::json_quote(trainer::run_status_name(ctx.status));
    }
    line += "}\n";
    std::fwrite(line.data(), 1, line.size(), out_);
    if (ctx.event == trainer::Event::Shutdown || ctx.event == trainer::Event::Checkpoint ||
        ctx.event == trainer::Event::Exception) {
      std::fflush(out_);
    }
  }

 private:
  std::string file_;
  bool indices_ = false;
  std::vector<trainer::Event> only_;
  std::FILE* out_ = nullptr;
  std::int64_t seq_ = 0;
};

}  // namespace

TRAINER_PLUGIN(RecordingPlugin)
