#pragma once
// Private: [distributed], the settings of a data-parallel run (torchrun, trainer launch).
#include <cstdint>

#include "trainer/settings.h"

namespace trainer {

struct DistributedSettings : Settings<DistributedSettings> {
  double timeout_s = 300;
  std::int64_t bucket_mb = 25;

  static void declare(SettingsSchema<DistributedSettings>& s) {
    s.add(&DistributedSettings::timeout_s, "timeout_s",
          "How long a rank waits for the others (to form the group, in each collective) before the run fails")
        .min(0, false);
    s.add(&DistributedSettings::bucket_mb, "bucket_mb", "Gradients are averaged in flat buckets of about this size")
        .min(1);
  }
};

}  // namespace trainer
