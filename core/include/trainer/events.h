#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "trainer/export.h"

namespace trainer {

/// Lifecycle events fired by the core, in the order of a run (docs/events.md has when each
/// fires, what its context holds and what a plugin may change).
enum class Event : std::uint8_t {
  Init,
  SelectDevice,
  ModelCreated,
  ModelToDevice,
  OptimizerCreated,
  FitStart,
  EpochStart,
  BatchStart,
  BeforeForward,
  AfterForward,
  BeforeBackward,
  AfterBackward,
  BeforeOptimizerStep,
  AfterOptimizerStep,
  BatchEnd,
  EvalStart,
  EvalEnd,
  EpochEnd,
  Checkpoint,
  OutOfMemory,
  FitEnd,
  Exception,
  Shutdown,
};

inline constexpr std::size_t kNumEvents = static_cast<std::size_t>(Event::Shutdown) + 1;

/// Every event, in firing order (for plugins that subscribe to all of them).
TRAINER_API std::vector<Event> all_events();
/// "BatchStart" etc.
TRAINER_API std::string_view event_name(Event e) noexcept;
/// Inverse of event_name; nullopt for an unknown name.
TRAINER_API std::optional<Event> event_from_name(std::string_view name) noexcept;
/// Closing events (After*, *End, Shutdown) run plugins in reverse priority order so that
/// a plugin's opening and closing handlers nest like wrappers.
TRAINER_API bool is_closing_event(Event e) noexcept;

}  // namespace trainer
