#pragma once
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/context.h"
#include "trainer/control.h"
#include "trainer/events.h"
#include "trainer/export.h"
#include "trainer/plugin.h"

namespace trainer {

/// Dispatches events to plugins in priority order (lower first, ties by registration
/// order); closing events (is_closing_event) run in reverse. Each plugin only sees the
/// events it declared. A throwing handler is reported with plugin and event names and then
/// handled by the plugin's FailurePolicy: an Observer's error is logged and the dispatch
/// goes on; an Essential's becomes a PluginError. c10::OutOfMemoryError passes through
/// unchanged so the core's OOM handling sees it.
class TRAINER_API EventBus {
 public:
  explicit EventBus(std::shared_ptr<spdlog::logger> logger = nullptr);

  /// Adds a plugin. `priority` and `policy` default to the plugin's own.
  void add(std::shared_ptr<Plugin> plugin, std::optional<int> priority = std::nullopt,
           std::optional<FailurePolicy> policy = std::nullopt);

  /// Fires `ctx.event` to its subscribers in order; all of them share `control`.
  void dispatch(EventContext& ctx, Control& control);

  /// Plugins in dispatch order for opening events.
  std::vector<std::shared_ptr<Plugin>> plugins() const;
  /// Number of plugins subscribed to `e`.
  std::size_t subscribers(Event e) const { return by_event_[static_cast<std::size_t>(e)].size(); }
  /// Errors an Observer plugin threw and the bus swallowed (for tests and the summary).
  std::size_t swallowed_errors() const { return swallowed_; }

 private:
  struct Entry {
    std::shared_ptr<Plugin> plugin;
    std::string name;
    int priority;
    FailurePolicy policy;
    std::size_t order;
  };
  void rebuild();

  std::shared_ptr<spdlog::logger> logger_;
  std::vector<Entry> entries_;
  std::array<std::vector<const Entry*>, kNumEvents> by_event_{};
  std::size_t swallowed_ = 0;
};

}  // namespace trainer
