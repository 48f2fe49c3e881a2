#pragma once
// The state of a study's trial as one enum with its table of names (what the journal,
// results.csv, the progress lines and MLflow's study/* counts say).
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string_view>

namespace trainer::tune {

enum class TrialState : std::uint8_t {
  Running,   ///< "RUNNING": started, not ended (a resume runs it again)
  Complete,  ///< "COMPLETE": ran to its end and logged the objective
  Pruned,    ///< "PRUNED": stopped by the pruner, or out of memory beyond what oom_backoff fixes
  Failed,    ///< "FAILED"
  Skipped,   ///< "SKIPPED": predicted out of memory, not run
};

/// "COMPLETE".
const char* trial_state_name(TrialState state);
/// The state named `name`; nullopt for a name that is none.
std::optional<TrialState> trial_state_named(std::string_view name);
/// Whether `state` ends a trial (every state but Running).
inline bool trial_ended(TrialState state) { return state != TrialState::Running; }
std::ostream& operator<<(std::ostream& os, TrialState state);

}  // namespace trainer::tune
