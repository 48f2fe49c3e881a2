#pragma once
// oom_backoff's settings (the plugins.oom_backoff keys, their defaults and rules, and the checks
// the schema cannot make) and the rungs of its ladder by name.
#include <c10/core/Device.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/context.h"
#include "trainer/devices.h"
#include "trainer/settings.h"

namespace trainer::oom_backoff {

/// The rungs of the ladder, in their default order (kRungNames' names).
enum class Rung { MicroBatch, Checkpoint, OptimizerBf16, Optimizer8bit, Offload, Device };
inline constexpr std::array<const char*, 6> kRungNames = {"micro_batch",    "checkpoint", "optimizer_bf16",
                                                          "optimizer_8bit", "offload",    "device"};
inline const char* rung_name(Rung r) { return kRungNames[static_cast<std::size_t>(r)]; }

struct OomBackoffSettings : trainer::Settings<OomBackoffSettings> {
  double factor = 0.5;
  std::int64_t min_micro_batch = 1;
  std::int64_t max_retries = 16;
  std::int64_t grow_after = 50;
  bool eval = true;
  std::vector<std::string> fallback_devices;
  std::vector<std::string> ladder{"auto"};
  bool allow_inexact = false;
  std::int64_t start_checkpointed_blocks = 0;
  std::int64_t start_moment_bits = 0;
  bool start_offload = false;

  static void declare(trainer::SettingsSchema<OomBackoffSettings>& s) {
    s.add(&OomBackoffSettings::factor, "factor", "Micro-batch multiplier after an OOM").min(0, false).max(1, false);
    s.add(&OomBackoffSettings::min_micro_batch, "min_micro_batch", "Give up below this micro-batch").min(1);
    s.add(&OomBackoffSettings::max_retries, "max_retries", "Retries of one batch before giving up").min(0);
    s.add(&OomBackoffSettings::grow_after, "grow_after",
          "Clean steps before taking one memory saver off (more moment bits, fewer checkpointed blocks, a "
          "micro-batch twice as large); 0 = never")
        .min(0);
    s.add(&OomBackoffSettings::eval, "eval", "Also retry evaluation with a smaller eval batch");
    s.add(&OomBackoffSettings::fallback_devices, "fallback_devices",
          "When backing off is exhausted, move the run to these devices in turn (e.g. [\"cuda:1\", \"cpu\"]) and "
          "retry there at the configured micro-batch")
        .check(trainer::device_setting_check());
    s.add(&OomBackoffSettings::ladder, "ladder",
          "The memory savers to climb after an out-of-memory error, first applicable first: any of micro_batch, "
          "checkpoint, optimizer_bf16, optimizer_8bit, offload, device; [\"auto\"] orders them by what was full")
        .choices({"auto", "micro_batch", "checkpoint", "optimizer_bf16", "optimizer_8bit", "offload", "device"});
    s.add(&OomBackoffSettings::allow_inexact, "allow_inexact",
          "Allow the rungs that change results (optimizer_bf16, optimizer_8bit: AdamW's moments in fewer bits)");
    s.add(&OomBackoffSettings::start_checkpointed_blocks, "start_checkpointed_blocks",
          "Start on the ladder with this many blocks checkpointed (the first ones), climbed down after grow_after "
          "clean steps like a rung taken; trainer sweep sets it for a trial predicted to fit only there")
        .min(0);
    s.add(&OomBackoffSettings::start_moment_bits, "start_moment_bits",
          "Start with AdamW's moments in 16 or 8 bits, fewer than the optimizer's (needs allow_inexact; 0 = as "
          "configured), climbed down like a rung taken")
        .min(0)
        .max(16);
    s.add(&OomBackoffSettings::start_offload, "start_offload",
          "Start with AdamW's moments in host memory, streamed through each optimizer step (a GPU only; exact), "
          "moved back like a rung taken");
  }
};

/// Checks at configure what the schema cannot: start_moment_bits is 0, 16 or 8, and not 0 only
/// with allow_inexact (`section`: plugins.oom_backoff, for where it was set).
void check_settings(const OomBackoffSettings& s, const trainer::Config& section);

/// Checks at FitStart that the start_* savers can apply to this model, optimizer and device;
/// throws an ExitRequest (exit code 2) naming the key when one cannot.
void check_start_savers(const OomBackoffSettings& s, const trainer::RunState& st, const c10::Device& device);

}  // namespace trainer::oom_backoff
