#include "trainer/exit_status.h"

#include "train/diverged.h"
#include "train/oom_recovery.h"
#include "trainer/memory.h"

namespace trainer {

ExitStatus exit_status_of(const std::exception& e, bool during_run) {
  if (const auto* request = dynamic_cast<const ExitRequest*>(&e)) {
    const RunStatus status = request->status();
    const int code = request->exit_code();
    const FailureKind kind = status != RunStatus::Failed ? FailureKind::None
                             : code == kExitNoDevice     ? FailureKind::NoDevice
                             : code == kExitUsage        ? FailureKind::Usage
                                                         : FailureKind::Error;
    return {code, status, kind};
  }
  if (dynamic_cast<const Interrupted*>(&e)) return {kExitInterrupted, RunStatus::Killed, FailureKind::None};
  if (dynamic_cast<const UsageError*>(&e)) return {kExitUsage, RunStatus::Failed, FailureKind::Usage};
  if (dynamic_cast<const PluginError*>(&e) && !during_run) {
    return {kExitUsage, RunStatus::Failed, FailureKind::Usage};
  }
  if (dynamic_cast<const Diverged*>(&e)) return {kExitTrainingFailed, RunStatus::Failed, FailureKind::Diverged};
  if (dynamic_cast<const OomFailure*>(&e) || is_out_of_memory(e)) {
    return {kExitTrainingFailed, RunStatus::Failed, FailureKind::OutOfMemory};
  }
  return {kExitTrainingFailed, RunStatus::Failed, FailureKind::Error};
}

}  // namespace trainer
