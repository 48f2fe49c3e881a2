#include "trainer/event_bus.h"

#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "trainer/logging.h"
#include "trainer/memory.h"

namespace trainer {

Plugin::~Plugin() = default;

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

void EventBus::dispatch(EventContext& ctx, Control& control) {
  const auto& list = by_event_[static_cast<std::size_t>(ctx.event)];
  for (const Entry* e : list) {
    try {
      e->plugin->on_event(ctx, control);
    } catch (const c10::OutOfMemoryError&) {
      throw;  // the core's OOM handling decides
    } catch (const ExitRequest&) {
      throw;  // the plugin ends the run with its own exit code
    } catch (const std::exception& ex) {
      if (is_out_of_memory(ex)) throw;  // CUDA libraries' OOMs arrive as plain c10::Error
      const std::string msg = detail::str("plugin '", e->name, "' failed in ", event_name(ctx.event), ": ", ex.what());
      if (e->policy == FailurePolicy::Essential) {
        // A usage error stays one (exit code 2): the plugin found its settings unusable.
        if (dynamic_cast<const UsageError*>(&ex)) throw UsageError(msg);
        throw PluginError(msg);
      }
      ++swallowed_;
      logger_->error("{} (observer plugin: the run continues)", msg);
    } catch (...) {
      const std::string msg =
          detail::str("plugin '", e->name, "' failed in ", event_name(ctx.event), ": unknown exception");
      if (e->policy == FailurePolicy::Essential) throw PluginError(msg);
      ++swallowed_;
      logger_->error("{} (observer plugin: the run continues)", msg);
    }
  }
}

}  // namespace trainer
