// The run status and failure kind tables (trainer/states.h); the out-of-memory phases have
// theirs in train/oom_phase.h, with what recovery needs of them.
#include <array>
#include <ostream>

#include "trainer/states.h"

namespace trainer {

namespace {

template <typename E>
struct Named {
  E value;
  const char* name;
};

constexpr std::array<Named<RunStatus>, 4> kRunStatusTable = {{
    {RunStatus::Running, "RUNNING"},
    {RunStatus::Finished, "FINISHED"},
    {RunStatus::Failed, "FAILED"},
    {RunStatus::Killed, "KILLED"},
}};

constexpr std::array<Named<FailureKind>, 6> kFailureKindTable = {{
    {FailureKind::None, "none"},
    {FailureKind::OutOfMemory, "out_of_memory"},
    {FailureKind::Usage, "usage"},
    {FailureKind::NoDevice, "no_device"},
    {FailureKind::Error, "error"},
    {FailureKind::Diverged, "diverged"},
}};

// Each row sits at its enumerator's place: the name is the table indexed by the value.
template <typename Table>
constexpr bool rows_in_order(const Table& table) {
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (static_cast<std::size_t>(table[i].value) != i) return false;
  }
  return true;
}
static_assert(rows_in_order(kRunStatusTable), "kRunStatusTable's rows must follow RunStatus's order");
static_assert(rows_in_order(kFailureKindTable), "kFailureKindTable's rows must follow FailureKind's order");

template <typename Table, typename E>
std::optional<E> named(const Table& table, std::string_view name) {
  for (const auto& row : table) {
    if (name == row.name) return row.value;
  }
  return std::nullopt;
}

}  // namespace

const char* run_status_name(RunStatus status) { return kRunStatusTable[static_cast<std::size_t>(status)].name; }

std::optional<RunStatus> run_status_named(std::string_view name) {
  return named<decltype(kRunStatusTable), RunStatus>(kRunStatusTable, name);
}

const char* failure_kind_name(FailureKind kind) { return kFailureKindTable[static_cast<std::size_t>(kind)].name; }

std::optional<FailureKind> failure_kind_named(std::string_view name) {
  return named<decltype(kFailureKindTable), FailureKind>(kFailureKindTable, name);
}

std::ostream& operator<<(std::ostream& os, RunStatus status) { return os << run_status_name(status); }
std::ostream& operator<<(std::ostream& os, FailureKind kind) { return os << failure_kind_name(kind); }

}  // namespace trainer
