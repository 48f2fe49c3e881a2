#include "trainer/event_bus.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "trainer/logging.h"
#include "trainer/memory.h"

namespace trainer {

Plugin::~Plugin() = default;
ForwardScope::~ForwardScope() = default;

EventBus::ForwardScopes::~ForwardScopes() {
  while (!scopes_.empty()) scopes_.pop_back();  // the last opened closes first
}

EventBus::EventBus(std::shared_ptr<spdlog::logger> logger) : logger_(logger ? std::move(logger) : default_logger()) {}

void EventBus::add(std::shared_ptr<Plugin> plugin, std::optional<int> priority, std::optional<FailurePolicy> policy) {
  TRAINER_ASSERT(plugin != nullptr);
  Entry e{plugin, plugin->name(), priority.value_or(plugin->default_priority()),
          policy.value_or(plugin->default_policy()), entries_.size()};
  entries_.push_back(std::move(e));
  rebuild();
}

void EventBus::rebuild() {
  std::stable_sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    return a.priority != b.priority ? a.priority < b.priority : a.order < b.order;
  });
  for (auto& list : by_event_) list.clear();
  for (const auto& e : entries_) {
    for (Event ev : e.plugin->events()) by_event_[static_cast<std::size_t>(ev)].push_back(&e);
  }
  for (std::size_t i = 0; i < kNumEvents; ++i) {
    if (is_closing_event(static_cast<Event>(i))) std::reverse(by_event_[i].begin(), by_event_[i].end());
  }
}

std::vector<std::shared_ptr<Plugin>> EventBus::plugins() const {
  std::vector<std::shared_ptr<Plugin>> out;
  for (const auto& e : entries_) out.push_back(e.plugin);
  return out;
}

template <typename F>
void EventBus::guarded(const Entry& e, std::string_view where, F&& f) {
  try {
    f();
  } catch (const c10::OutOfMemoryError&) {
    throw;  // the core's OOM handling decides
  } catch (const ExitRequest&) {
    throw;  // the plugin ends the run with its own exit code
  } catch (const Interrupted&) {
    throw;  // Ctrl-C answered inside the plugin's long work (throw_if_interrupted)
  } catch (const std::exception& ex) {
    if (is_out_of_memory(ex)) throw;  // CUDA libraries' OOMs arrive as plain c10::Error
    const std::string msg = fmt::format("plugin '{}' failed in {}: {}", e.name, where, ex.what());
    if (e.policy == FailurePolicy::Essential) {
      // A usage error stays one (exit code 2): the plugin found its settings unusable.
      if (dynamic_cast<const UsageError*>(&ex)) throw UsageError(msg);
      throw PluginError(msg);
    }
    observer_failed(e, where, msg, ex.what());
  } catch (...) {
    const std::string msg = fmt::format("plugin '{}' failed in {}: unknown exception", e.name, where);
    if (e.policy == FailurePolicy::Essential) throw PluginError(msg);
    observer_failed(e, where, msg, "unknown exception");
  }
}

void EventBus::dispatch(EventContext& ctx, Control& control) {
  const auto& list = by_event_[static_cast<std::size_t>(ctx.event)];
  const std::string_view where = event_name(ctx.event);
  for (const Entry* e : list) {
    // Each plugin writes its own reason; the earlier ones' are kept in control.reasons.
    const bool stopping = control.stop_training;
    control.reason.clear();
    guarded(*e, where, [&] { e->plugin->on_event(ctx, control); });
    if (!control.reason.empty()) control.reasons.push_back({e->name, control.reason});
    if (!stopping && control.stop_training && control.stopped_by.empty()) control.stopped_by = e->name;
  }
  if (!control.reasons.empty()) control.reason = control.reasons_text();
}

EventBus::ForwardScopes EventBus::open_forward_scopes(const EventContext& ctx) {
  ForwardScopes out;
  const std::string_view where = "forward_scope";
  for (const auto& e : entries_) {
    guarded(e, where, [&] {
      if (auto scope = e.plugin->forward_scope(ctx)) out.scopes_.push_back(std::move(scope));
    });
  }
  return out;
}

void EventBus::for_each(const std::string& where, const std::function<void(Plugin&)>& f) {
  for (const auto& e : entries_) guarded(e, where, [&] { f(*e.plugin); });
}

void EventBus::observer_failed(const Entry& e, std::string_view where, const std::string& msg,
                               const std::string& what) {
  ++swallowed_;
  auto it = std::find_if(failures_.begin(), failures_.end(),
                         [&](const ObserverFailure& f) { return f.plugin == e.name && f.where == where; });
  if (it == failures_.end()) {
    failures_.push_back({e.name, std::string(where), 1, what});
    logger_->error("{} (observer plugin: the run continues)", msg);
    return;
  }
  const std::int64_t n = ++it->count;
  if (n == 2) {
    logger_->error(
        "{} (observer plugin: the run continues; failed twice in {}: further failures there are counted, "
        "not logged, and summarised at the end of the run)",
        msg, where);
    return;
  }
  bool tenfold = n >= 10;
  for (std::int64_t k = n; tenfold && k > 1; k /= 10) tenfold = k % 10 == 0;
  if (tenfold) logger_->warn("plugin '{}' has failed {} times in {} (last: {})", e.name, n, where, msg);
}

}  // namespace trainer
