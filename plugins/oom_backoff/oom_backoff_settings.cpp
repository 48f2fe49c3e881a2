// oom_backoff's settings checks: those at configure the schema cannot make, and those of the
// start_* savers against the model, the optimizer and the device at FitStart.
#include "oom_backoff_settings.h"

#include "trainer/error.h"

namespace trainer::oom_backoff {

void check_settings(const OomBackoffSettings& s, const trainer::Config& section) {
  TRAINER_CHECK_T(
      trainer::UsageError, s.start_moment_bits == 0 || s.start_moment_bits == 16 || s.start_moment_bits == 8,
      section.origin("start_moment_bits"), ": plugins.oom_backoff.start_moment_bits = ", s.start_moment_bits,
      "; allowed: 0 (as configured), 16, 8");
  TRAINER_CHECK_T(trainer::UsageError, s.allow_inexact || s.start_moment_bits == 0, section.origin("start_moment_bits"),
                  ": plugins.oom_backoff.start_moment_bits = ", s.start_moment_bits,
                  " changes results (AdamW's moments rounded); set plugins.oom_backoff.allow_inexact = true too");
}

void check_start_savers(const OomBackoffSettings& s, const trainer::RunState& st, const c10::Device& device) {
  const auto refuse = [](const char* key, const std::string& value, const std::string& why) {
    throw trainer::ExitRequest(trainer::kExitUsage, trainer::RunStatus::Failed,
                               std::string("plugins.oom_backoff.") + key + " = " + value + ": " + why);
  };
  if (s.start_checkpointed_blocks > st.model_blocks) {
    refuse("start_checkpointed_blocks", std::to_string(s.start_checkpointed_blocks),
           "the model has " + std::to_string(st.model_blocks) +
               " blocks the core can checkpoint (blocks another plugin wraps do not count)");
  }
  if (s.start_moment_bits != 0 && st.optimizer_moment_bits == 0) {
    refuse("start_moment_bits", std::to_string(s.start_moment_bits),
           "the optimizer's moments cannot change their bits (AdamW's and adamw8bit's can, outside a "
           "data-parallel run)");
  }
  if (s.start_moment_bits != 0 && s.start_moment_bits >= st.configured_moment_bits) {
    refuse("start_moment_bits", std::to_string(s.start_moment_bits),
           "the optimizer keeps its moments in " + std::to_string(st.configured_moment_bits) +
               " bits already; a start on the ladder has fewer (16 or 8)");
  }
  if (s.start_offload && device.is_cpu()) {
    refuse("start_offload", "true", "the run is on the CPU, whose memory is the host's: there is nothing to offload");
  }
  if (s.start_offload && st.optimizer_moment_bits == 0) {
    refuse("start_offload", "true",
           "the optimizer's moments cannot move to host memory (AdamW's and adamw8bit's can, outside a "
           "data-parallel run)");
  }
}

}  // namespace trainer::oom_backoff
