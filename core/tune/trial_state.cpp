#include "trial_state.h"

#include <array>
#include <ostream>

namespace trainer::tune {

namespace {

struct Row {
  TrialState state;
  const char* name;
};

constexpr std::array<Row, 5> kTrialStateTable = {{
    {TrialState::Running, "RUNNING"},
    {TrialState::Complete, "COMPLETE"},
    {TrialState::Pruned, "PRUNED"},
    {TrialState::Failed, "FAILED"},
    {TrialState::Skipped, "SKIPPED"},
}};

// Each row sits at its enumerator's place: the name is the table indexed by the state.
constexpr bool rows_in_order() {
  for (std::size_t i = 0; i < kTrialStateTable.size(); ++i) {
    if (static_cast<std::size_t>(kTrialStateTable[i].state) != i) return false;
  }
  return true;
}
static_assert(rows_in_order(), "kTrialStateTable's rows must follow TrialState's order");

}  // namespace

const char* trial_state_name(TrialState state) { return kTrialStateTable[static_cast<std::size_t>(state)].name; }

std::optional<TrialState> trial_state_named(std::string_view name) {
  for (const auto& row : kTrialStateTable) {
    if (name == row.name) return row.state;
  }
  return std::nullopt;
}

std::ostream& operator<<(std::ostream& os, TrialState state) { return os << trial_state_name(state); }

}  // namespace trainer::tune
