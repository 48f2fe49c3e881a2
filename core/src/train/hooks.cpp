#include "train/hooks.h"

#include <spdlog/spdlog.h>

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
  if (names.size() < 2) return detail::join(names);
  const std::string last = names.back();
  names.pop_back();
  return detail::join(names) + " and " + last;
}

}  // namespace

Hooks::Hooks(const Config& cfg, std::shared_ptr<spdlog::logger> log, MetricsLogger& metrics,
             const std::string& run_dir, const RunState& state)
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
      throw PluginError(detail::str("plugin '", p->name(), "' failed in configure: ", e.what()));
    } catch (...) {
      throw PluginError(detail::str("plugin '", p->name(), "' failed in configure: an exception that is not a ",
                                    "std::exception"));
    }
    bus_.add(p, priority, policy);
  }
}

Control Hooks::fire(Event e, const EventArgs& args) {
  Control control;
  if (bus_.subscribers(e) == 0) return control;
  ctx_.event = e;
  ctx_.state = state_;
  ctx_.batch = args.batch;
  ctx_.indices = args.indices;
  ctx_.outputs = args.outputs;
  ctx_.loss = args.loss;
  ctx_.eval_metrics = args.eval_metrics;
  ctx_.oom = args.oom;
  // The arguments live only during the event: no pointer to them survives it, whatever happens.
  struct ClearArgs {
    EventContext& c;
    ~ClearArgs() {
      c.batch = nullptr;
      c.indices = nullptr;
      c.outputs = nullptr;
      c.loss = nullptr;
      c.eval_metrics = nullptr;
      c.oom = nullptr;
    }
  } clear{ctx_};
  bus_.dispatch(ctx_, control);
  if (control.any()) apply(e, control);
  return control;
}

void Hooks::apply(Event e, Control& c) {
  for (const auto& field : kControlFieldTable) {
    if (!c.has(field.field) || honours(e, field.field)) continue;
    if (field.warn_when_ignored) {
      log_->warn("{} is honoured in {} only; ignored in {}", field.name, events_honouring(field.field), event_name(e));
    }
    c.clear(field.field);
  }
  const std::string why = c.reason.empty() ? "" : " (" + c.reason + ")";
  if (c.stop_training && !stop_) {
    stop_ = true;
    stop_reason_ = "a plugin asked to stop in " + std::string(event_name(e)) + why;
    log_->info("{}; stopping at the next safe point", stop_reason_);
  }
  if (c.request_checkpoint) checkpoint_ = true;
  if (c.request_eval) eval_ = true;
}

}  // namespace trainer
