#include "trainer/events.h"

namespace trainer {

namespace {

// The tables are indexed by enum value: each row must sit at its own index.
constexpr bool tables_in_enum_order() {
  for (std::size_t i = 0; i < kEventTable.size(); ++i) {
    if (static_cast<std::size_t>(kEventTable[i].event) != i) return false;
  }
  for (std::size_t i = 0; i < kControlFieldTable.size(); ++i) {
    if (static_cast<std::size_t>(kControlFieldTable[i].field) != i) return false;
  }
  return true;
}
static_assert(tables_in_enum_order(), "kEventTable and kControlFieldTable must list their rows in enum order");

}  // namespace

std::vector<Event> all_events() {
  std::vector<Event> all;
  for (const auto& row : kEventTable) all.push_back(row.event);
  return all;
}

std::string_view event_name(Event e) noexcept {
  const auto i = static_cast<std::size_t>(e);
  return i < kEventTable.size() ? kEventTable[i].name : std::string_view("?");
}

std::optional<Event> event_from_name(std::string_view name) noexcept {
  for (const auto& row : kEventTable) {
    if (row.name == name) return row.event;
  }
  return std::nullopt;
}

bool is_closing_event(Event e) noexcept {
  const auto i = static_cast<std::size_t>(e);
  return i < kEventTable.size() && kEventTable[i].closing;
}

bool honours(Event e, ControlField f) noexcept {
  const auto i = static_cast<std::size_t>(e);
  return i < kEventTable.size() && (kEventTable[i].honours & bit(f)) != 0;
}

std::string_view control_field_name(ControlField f) noexcept {
  const auto i = static_cast<std::size_t>(f);
  return i < kControlFieldTable.size() ? kControlFieldTable[i].name : std::string_view("?");
}

}  // namespace trainer
