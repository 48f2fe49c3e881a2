#include "train/hooks.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "trainer/error.h"
#include "trainer/recipe.h"

namespace trainer {

namespace {

/// "BatchStart and BatchEnd": the events that honour `f`.
std::string events_honouring(ControlField f) {
  std::vector<std::string> names;
  for (const auto& row : kEventTable) {
    if (honours(row.event, f)) names.emplace_back(row.name);
  }
  if (names.size() < 2) return fmt::to_string(fmt::join(names, ", "));
  const std::string last = names.back();
  names.pop_back();
  return fmt::to_string(fmt::join(names, ", ")) + " and " + last;
}

}  // namespace

Hooks::Hooks(const Config& cfg, std::shared_ptr<spdlog::logger> log, MetricsLogger& metrics, const std::string& run_dir,
             const RunState& state)
    : cfg_(cfg), log_(std::move(log)), state_(state), bus_(log_) {
  ctx_.config = &cfg_;
  ctx_.logger = log_;
  ctx_.metrics = &metrics;
  ctx_.run_dir = run_dir;
}

void Hooks::add_plugins(const std::vector<std::shared_ptr<Plugin>>& plugins) {
  for (std::size_t i = 0; i < plugins.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      TRAINER_CHECK_T(UsageError, plugins[j]->name() != plugins[i]->name(), "plugin '", plugins[i]->name(),
                      "' is given twice (plugins ", j + 1, " and ", i + 1, " of the run); give it once");
    }
  }
  for (const auto& p : plugins) {
    const Config section = cfg_.sub("plugins." + p->name());
    const auto dispatch = PluginDispatch::from(section);
    std::optional<int> priority;
    std::optional<FailurePolicy> policy;
    if (dispatch.priority) priority = static_cast<int>(*dispatch.priority);
    if (dispatch.policy) policy = *dispatch.policy == "essential" ? FailurePolicy::Essential : FailurePolicy::Observer;
    try {
      p->configure(section, log_);
    } catch (const Error&) {
      throw;  // trainer's own errors keep their meaning (a config error stays exit code 2)
    } catch (const std::exception& e) {
      throw PluginError(fmt::format("plugin '{}' failed in configure: {}", p->name(), e.what()));
    } catch (...) {
      throw PluginError(
          fmt::format("plugin '{}' failed in configure: an exception that is not a std::exception", p->name()));
    }
    bus_.add(p, priority, policy);
  }
}

namespace {

/// Points the context at one event's arguments for the guard's lifetime: no pointer to them
/// survives the event, whatever happens.
struct ScopedArgs {
  ScopedArgs(EventContext& ctx, Event e, const RunState& state, const EventArgs& args) : c(ctx) {
    c.event = e;
    c.state = state;
    c.batch = args.batch;
    c.indices = args.indices;
    c.outputs = args.outputs;
    c.loss = args.loss;
    c.backward_loss = args.backward_loss;
    c.eval_metrics = args.eval_metrics;
    c.oom = args.oom;
    c.resume = args.resume;
  }
  ~ScopedArgs() {
    c.batch = nullptr;
    c.indices = nullptr;
    c.outputs = nullptr;
    c.loss = nullptr;
    c.backward_loss = nullptr;
    c.eval_metrics = nullptr;
    c.oom = nullptr;
    c.resume = nullptr;
  }
  ScopedArgs(const ScopedArgs&) = delete;
  ScopedArgs& operator=(const ScopedArgs&) = delete;
  EventContext& c;
};

}  // namespace

void Hooks::start_memory_timeline(const MemorySettings& s, std::int64_t rank) {
  const std::string name = rank > 0 ? "memory-rank-" + std::to_string(rank) + ".jsonl" : std::string("memory.jsonl");
  timeline_ = std::make_unique<MemoryTimeline>(s, ctx_.run_dir.empty() ? "" : ctx_.run_dir + "/" + name, log_);
}

Control Hooks::fire(Event e, const EventArgs& args) {
  if (timeline_) {
    try {
      timeline_->observe(e, state_, ctx_, args.oom);
    } catch (const std::exception& error) {
      // What the memory was spent on is never worth the run (nor the event the plugins are
      // about to hear of: an out-of-memory error's retry may depend on it). The event is left
      // out; the next ones are observed (said once).
      if (!timeline_warned_) log_->warn("the memory timeline left out {}: {}", event_name(e), error.what());
      timeline_warned_ = true;
    }
  }
  Control control;
  if (bus_.subscribers(e) == 0) return control;
  const ScopedArgs scoped(ctx_, e, state_, args);
  bus_.dispatch(ctx_, control);
  if (control.any()) apply(e, control);
  return control;
}

EventBus::ForwardScopes Hooks::forward_scopes(Event e, const EventArgs& args) {
  const ScopedArgs scoped(ctx_, e, state_, args);
  return bus_.open_forward_scopes(ctx_);
}

void Hooks::apply(Event e, Control& c) {
  for (const auto& field : kControlFieldTable) {
    if (!c.has(field.field) || honours(e, field.field)) continue;
    if (field.warn_when_ignored) {
      log_->warn("{} is honoured in {} only; ignored in {}", field.name, events_honouring(field.field), event_name(e));
    }
    c.clear(field.field);
  }
  if (c.stop_training && !stop_) {
    stop_ = true;
    stopped_by_ = c.stopped_by.empty() ? "a plugin" : c.stopped_by;
    std::string why = c.reason_of(c.stopped_by);
    if (why.empty()) why = c.reasons_text();  // the plugin that stopped said nothing; others may have
    stop_reason_ = why.empty() ? "asked to stop in " + std::string(event_name(e)) : why;
    log_->info("plugin '{}' asked to stop in {}: {}; stopping at the next safe point", stopped_by_, event_name(e),
               stop_reason_);
  }
  if (c.request_checkpoint) checkpoint_ = true;
  if (c.request_eval) eval_ = true;
}

std::map<std::string, PluginState> Hooks::save_states() {
  std::map<std::string, PluginState> out;
  bus_.for_each("save_state", [&](Plugin& p) {
    PluginState state;
    p.save_state(state);
    for (const auto& key : state.keys()) {
      TRAINER_CHECK(!key.empty() && key.find('\n') == std::string::npos, "plugin state key '", key,
                    "' is empty or holds a line break");
    }
    if (!state.empty()) out[p.name()] = std::move(state);
  });
  return out;
}

void Hooks::load_states(const std::map<std::string, PluginState>& states, ResumeInfo& info) {
  std::vector<std::string> loaded;
  bus_.for_each("load_state", [&](Plugin& p) {
    const std::string name = p.name();
    loaded.push_back(name);
    const auto it = states.find(name);
    if (it == states.end()) {
      info.plugins_without_state.push_back(name);
      return;
    }
    p.load_state(it->second);
    info.restored_plugins.push_back(name);
  });
  for (const auto& kv : states) {
    if (std::find(loaded.begin(), loaded.end(), kv.first) == loaded.end()) {
      log_->warn("{} holds state of plugin '{}', which this run does not load: ignored", info.checkpoint, kv.first);
    }
  }
  if (!info.restored_plugins.empty()) {
    log_->info("plugin state restored: {}", fmt::join(info.restored_plugins, ", "));
  }
}

std::vector<std::string> Hooks::observer_failure_summary() const {
  std::vector<std::string> out;
  for (const auto& f : bus_.observer_failures()) {
    out.push_back(fmt::format("plugin '{}' failed {}{} in {} (first error: {})", f.plugin, f.count,
                              f.count == 1 ? " time" : " times", f.where, f.first_message));
  }
  return out;
}

}  // namespace trainer
