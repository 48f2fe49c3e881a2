#pragma once
// Private: [distributed], the settings of a data-parallel run (torchrun, trainer launch).
#include <cstdint>

#include "trainer/settings.h"

namespace trainer {

struct DistributedSettings : Settings<DistributedSettings> {
  double timeout_s = 300;
  double bucket_mb = 25;
  bool overlap = true;

  static void declare(SettingsSchema<DistributedSettings>& s) {
    s.add(&DistributedSettings::timeout_s, "timeout_s",
          "How long a rank waits for the others (to form the group, in each collective) before the run fails")
        .min(0, false);
    s.add(&DistributedSettings::bucket_mb, "bucket_mb",
          "Gradients are averaged in flat buckets of about this many MiB (the first, started first, about 1 MiB)")
        .min(0, false)
        .max(1 << 20);
    s.add(&DistributedSettings::overlap, "overlap",
          "Start each bucket's all-reduce inside the backward, as soon as its gradients are complete");
  }
};

}  // namespace trainer
