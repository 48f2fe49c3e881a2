#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
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
///
/// An Observer failing again in the same place is not logged each time: the first failure
/// is logged in full, the second says that later ones are only counted, and then only every
/// tenfold count is logged; observer_failures() has the totals for the run's summary.
///
/// After each plugin, what it wrote into Control::reason is recorded in Control::reasons
/// under its name, and the first plugin that set stop_training in Control::stopped_by.
class TRAINER_API EventBus {
 public:
  explicit EventBus(std::shared_ptr<spdlog::logger> logger = nullptr);

  /// Adds a plugin. `priority` and `policy` default to the plugin's own.
  void add(std::shared_ptr<Plugin> plugin, std::optional<int> priority = std::nullopt,
           std::optional<FailurePolicy> policy = std::nullopt);

  /// Fires `ctx.event` to its subscribers in order; all of them share `control`.
  void dispatch(EventContext& ctx, Control& control);

  /// The plugins' forward scopes (Plugin::forward_scope), alive as long as this object;
  /// closed in reverse order of opening.
  class TRAINER_API ForwardScopes {
   public:
    ForwardScopes() = default;
    ForwardScopes(ForwardScopes&&) = default;
    ForwardScopes& operator=(ForwardScopes&&) = delete;
    ~ForwardScopes();
    std::size_t size() const { return scopes_.size(); }

   private:
    friend class EventBus;
    std::vector<std::unique_ptr<ForwardScope>> scopes_;
  };
  /// Opens every plugin's forward scope for `ctx` (ctx.event is BeforeForward or
  /// EvalBatchStart), in dispatch order, under the plugins' failure policies (scopes already
  /// opened are closed when one throws). Allocates nothing when no plugin returns a scope.
  ForwardScopes open_forward_scopes(const EventContext& ctx);

  /// Plugins in dispatch order for opening events.
  std::vector<std::shared_ptr<Plugin>> plugins() const;
  /// Number of plugins subscribed to `e`.
  std::size_t subscribers(Event e) const { return by_event_[static_cast<std::size_t>(e)].size(); }
  /// Errors an Observer plugin threw and the bus swallowed (for tests and the summary).
  std::size_t swallowed_errors() const { return swallowed_; }

  /// Calls `f` on every plugin in dispatch order, outside any event (`where` names the call in
  /// messages, e.g. "save_state"), with the same failure policies as dispatch().
  void for_each(const std::string& where, const std::function<void(Plugin&)>& f);

  /// The failures of Observer plugins, one per plugin and place, in order of first failure.
  struct ObserverFailure {
    std::string plugin;
    std::string where;  ///< the event's name, or the call's (save_state, load_state)
    std::int64_t count = 0;
    std::string first_message;  ///< what the first failure threw
  };
  const std::vector<ObserverFailure>& observer_failures() const { return failures_; }

 private:
  struct Entry {
    std::shared_ptr<Plugin> plugin;
    std::string name;
    int priority;
    FailurePolicy policy;
    std::size_t order;
  };
  void rebuild();
  /// Runs `f` for one plugin, applying its failure policy to what it throws. (A template, not
  /// a std::function: dispatch is on the training step's path and must not allocate.)
  template <typename F>
  void guarded(const Entry& e, std::string_view where, F&& f);
  /// An Observer's failure: counted, logged the first times only.
  void observer_failed(const Entry& e, std::string_view where, const std::string& msg, const std::string& what);

  std::shared_ptr<spdlog::logger> logger_;
  std::vector<Entry> entries_;
  std::array<std::vector<const Entry*>, kNumEvents> by_event_{};
  std::size_t swallowed_ = 0;
  std::vector<ObserverFailure> failures_;
};

}  // namespace trainer
