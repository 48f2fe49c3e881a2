#include "trainer/events.h"

namespace trainer {

namespace {
constexpr std::array<std::string_view, kNumEvents> kNames = {
    "Init",
    "SelectDevice",
    "ModelCreated",
    "ModelToDevice",
    "OptimizerCreated",
    "FitStart",
    "EpochStart",
    "BatchStart",
    "BeforeForward",
    "AfterForward",
    "BeforeBackward",
    "AfterBackward",
    "BeforeOptimizerStep",
    "AfterOptimizerStep",
    "BatchEnd",
    "EvalStart",
    "EvalEnd",
    "EpochEnd",
    "Checkpoint",
    "OutOfMemory",
    "FitEnd",
    "Exception",
    "Shutdown",
};
}  // namespace

std::vector<Event> all_events() {
  std::vector<Event> all;
  for (std::size_t i = 0; i < kNumEvents; ++i) all.push_back(static_cast<Event>(i));
  return all;
}

std::string_view event_name(Event e) noexcept {
  const auto i = static_cast<std::size_t>(e);
  return i < kNames.size() ? kNames[i] : std::string_view("?");
}

std::optional<Event> event_from_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<Event>(i);
  }
  return std::nullopt;
}

bool is_closing_event(Event e) noexcept {
  switch (e) {
    case Event::AfterForward:
    case Event::AfterBackward:
    case Event::AfterOptimizerStep:
    case Event::BatchEnd:
    case Event::EvalEnd:
    case Event::EpochEnd:
    case Event::FitEnd:
    case Event::Shutdown:
      return true;
    default:
      return false;
  }
}

}  // namespace trainer
