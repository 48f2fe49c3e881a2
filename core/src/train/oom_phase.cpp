#include "train/oom_phase.h"

#include <ostream>
#include <string>

namespace trainer {

namespace {

// Each row sits at its enumerator's place: oom_phase_info indexes the table.
constexpr bool rows_in_order() {
  for (std::size_t i = 0; i < kOomPhaseTable.size(); ++i) {
    if (static_cast<std::size_t>(kOomPhaseTable[i].phase) != i) return false;
  }
  return true;
}
static_assert(rows_in_order(), "kOomPhaseTable's rows must follow OomPhase's order");

}  // namespace

const OomPhaseInfo& oom_phase_info(OomPhase phase) { return kOomPhaseTable[static_cast<std::size_t>(phase)]; }

const char* oom_phase_name(OomPhase phase) { return oom_phase_info(phase).name; }

bool oom_phase_micro_batch_helps(OomPhase phase) { return oom_phase_info(phase).micro_batch_helps; }

std::optional<OomPhase> oom_phase_named(std::string_view name) {
  for (const auto& row : kOomPhaseTable) {
    if (name == row.name) return row.phase;
  }
  return std::nullopt;
}

OomPhase oom_phase_of_wire(std::int64_t code) {
  for (const auto& row : kOomPhaseTable) {
    if (row.wire_code != 0 && row.wire_code == code) return row.phase;
  }
  return OomPhase::Forward;
}

std::string_view oom_advice(OomPhase phase) {
  static const std::string micro = std::string(
                                       "a smaller training.micro_batch_size (gradient accumulation keeps the "
                                       "effective batch)") +
                                   kActivationAdvice;
  static const std::string eval = std::string("a smaller eval.batch_size") + kActivationAdvice;
  const OomPhaseInfo& row = oom_phase_info(phase);
  if (row.advice != nullptr) return row.advice;
  return phase == OomPhase::Eval ? std::string_view(eval) : std::string_view(micro);
}

std::ostream& operator<<(std::ostream& os, OomPhase phase) { return os << oom_phase_name(phase); }

}  // namespace trainer
