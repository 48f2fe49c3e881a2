#pragma once
// Private: the loop's side of the event bus. Fires events with their arguments, keeps the
// run-long part of the context, and applies what plugins ask through Control by the table in
// events.h.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/memory_timeline.h"
#include "trainer/context.h"
#include "trainer/control.h"
#include "trainer/event_bus.h"
#include "trainer/events.h"

namespace trainer {

/// What one event carries besides the run-long context. The context points at these only
/// while the event is dispatched, and the pointers are null again afterwards.
struct EventArgs {
  const Batch* batch = nullptr;
  const at::Tensor* indices = nullptr;
  const at::Tensor* outputs = nullptr;
  const at::Tensor* loss = nullptr;
  at::Tensor* backward_loss = nullptr;  ///< BeforeBackward only
  std::map<std::string, double>* eval_metrics = nullptr;
  const OomInfo* oom = nullptr;
  const ResumeInfo* resume = nullptr;

  /// BeforeForward … AfterBackward: the micro-batch and its dataset indices; from AfterForward
  /// on also its logits (AfterForward only) and its scaled loss.
  static EventArgs micro_batch(const Batch& batch, const at::Tensor& indices, const at::Tensor* outputs = nullptr,
                               const at::Tensor* loss = nullptr) {
    EventArgs a;
    a.batch = &batch;
    a.indices = &indices;
    a.outputs = outputs;
    a.loss = loss;
    return a;
  }
  /// EvalMetrics (writable by plugins), EvalEnd: the evaluation's metrics.
  static EventArgs evaluated(std::map<std::string, double>& metrics) {
    EventArgs a;
    a.eval_metrics = &metrics;
    return a;
  }
  /// Resume: what was restored.
  static EventArgs resumed(const ResumeInfo& info) {
    EventArgs a;
    a.resume = &info;
    return a;
  }
  /// OutOfMemory: what failed.
  static EventArgs out_of_memory(const OomInfo& info) {
    EventArgs a;
    a.oom = &info;
    return a;
  }
};

/// Fires events to the plugins and keeps what they asked the loop to do at its next safe
/// point (stop, evaluate, checkpoint).
class Hooks {
 public:
  /// `state` is the run's counters, copied into the context at every event.
  Hooks(const Config& cfg, std::shared_ptr<spdlog::logger> log, MetricsLogger& metrics, const std::string& run_dir,
        const RunState& state);

  /// Configures each plugin with its `plugins.<name>` section (in load order) and registers it
  /// with its priority and failure policy.
  void add_plugins(const std::vector<std::shared_ptr<Plugin>>& plugins);

  /// Fires `e` with `args`. Returns the plugins' Control holding only the fields `e` honours
  /// (kEventTable); the others are cleared, with a warning where kControlFieldTable says so.
  /// stop_training, request_eval and request_checkpoint are recorded for the safe points.
  Control fire(Event e, const EventArgs& args = {});

  /// The plugins' forward scopes around one forward and its loss (Plugin::forward_scope), for
  /// `e` = BeforeForward (training) or EvalBatchStart (evaluation) with the batch in `args`.
  EventBus::ForwardScopes forward_scopes(Event e, const EventArgs& args);

  /// Attributes the run's memory and samples it by category at the step's events into
  /// RUN_DIR/memory.jsonl (memory-rank-<rank>.jsonl for the ranks other than 0), as `s` says
  /// ([memory]); nothing before this is called.
  void start_memory_timeline(const MemorySettings& s, std::int64_t rank);

  /// Whether any plugin subscribed to `e` (to skip work only its arguments need).
  bool wants(Event e) const { return bus_.subscribers(e) > 0; }

  /// The run-long part of the context: device, model, optimizer, checkpoint_path, status,
  /// exception. Whoever owns one of them keeps it current here.
  EventContext& context() { return ctx_; }

  /// A plugin asked to stop: which one (the first), and why.
  bool stop_requested() const { return stop_; }
  const std::string& stopped_by() const { return stopped_by_; }
  const std::string& stop_reason() const { return stop_reason_; }

  /// Every plugin's save_state(), by plugin name; plugins that store nothing are left out.
  /// An Observer that throws is logged and left out; an Essential's error is thrown.
  std::map<std::string, PluginState> save_states();
  /// Hands each plugin of the run its entry of `states` (load_state()); fills the plugin lists
  /// of `info` and warns about states of plugins this run does not load.
  void load_states(const std::map<std::string, PluginState>& states, ResumeInfo& info);

  /// "plugin 'x' failed 12 times in BatchEnd (first: ...)" per failing Observer; empty when none.
  std::vector<std::string> observer_failure_summary() const;
  /// Whether a checkpoint (an evaluation) was requested since the last call; clears the request.
  bool take_checkpoint_request() { return std::exchange(checkpoint_, false); }
  bool take_eval_request() { return std::exchange(eval_, false); }

 private:
  void apply(Event e, Control& c);

  const Config& cfg_;
  std::shared_ptr<spdlog::logger> log_;
  const RunState& state_;
  EventBus bus_;
  EventContext ctx_;
  std::unique_ptr<MemoryTimeline> timeline_;
  bool timeline_warned_ = false;  ///< an event the timeline could not observe was said
  bool stop_ = false, checkpoint_ = false, eval_ = false;
  std::string stopped_by_, stop_reason_;
};

}  // namespace trainer
