// oom_backoff's ladder order: the configured ladder checked, the automatic order by what was
// full, and the texts naming the rungs and the savers that are on.
#include "oom_backoff_ladder.h"

#include <algorithm>
#include <set>

#include "trainer/error.h"
#include "trainer/memory.h"

namespace trainer::oom_backoff {

std::vector<Rung> configured_ladder(const OomBackoffSettings& s, const std::string& key) {
  TRAINER_CHECK_T(trainer::UsageError, !s.ladder.empty(), key,
                  ": plugins.oom_backoff.ladder is empty; give [\"auto\"] or the rungs to climb");
  std::vector<Rung> order;
  std::set<std::string> seen;
  for (const auto& r : s.ladder) {
    TRAINER_CHECK_T(trainer::UsageError, r != "auto" || s.ladder.size() == 1, key,
                    ": \"auto\" in plugins.oom_backoff.ladder stands alone ([\"auto\"]), not among named rungs");
    TRAINER_CHECK_T(trainer::UsageError, seen.insert(r).second, key, ": rung \"", r,
                    "\" is named twice in plugins.oom_backoff.ladder");
    if (r != "auto") {
      order.push_back(static_cast<Rung>(std::find(kRungNames.begin(), kRungNames.end(), r) - kRungNames.begin()));
    }
  }
  if (!order.empty() && !s.fallback_devices.empty() &&
      std::find(order.begin(), order.end(), Rung::Device) == order.end()) {
    order.push_back(Rung::Device);  // fallback_devices are where the run goes when the rest is used up
  }
  return order;
}

bool optimizer_full(const trainer::OomInfo& oom) {
  if (oom.phase == trainer::OomPhase::OptimizerStep) return true;
  return oom.live && oom.live->largest() == trainer::MemoryCategory::OptimizerState;
}

std::vector<Rung> ladder(const std::vector<Rung>& order, const trainer::OomInfo& oom, const c10::Device& device) {
  if (!order.empty()) return order;
  using R = Rung;
  if (optimizer_full(oom))
    return {R::OptimizerBf16, R::Optimizer8bit, R::Offload, R::MicroBatch, R::Checkpoint, R::Device};
  const std::int64_t cur = oom.micro_batch_size;
  const bool small = cur <= (device.is_cpu() ? 2 : 8);
  if (small) return {R::Checkpoint, R::MicroBatch, R::OptimizerBf16, R::Optimizer8bit, R::Offload, R::Device};
  return {R::MicroBatch, R::Checkpoint, R::OptimizerBf16, R::Optimizer8bit, R::Offload, R::Device};
}

std::string ladder_text(const std::vector<Rung>& order, const trainer::OomInfo& oom, const c10::Device& device) {
  std::string out;
  for (const Rung r : ladder(order, oom, device)) out += (out.empty() ? "" : ", ") + std::string(rung_name(r));
  return order.empty() ? "auto: " + out : out;
}

std::string savers_text(const trainer::RunState& st) {
  std::string out;
  if (st.checkpointed_blocks > 0) {
    out = std::to_string(st.checkpointed_blocks) + " of " + std::to_string(st.model_blocks) + " blocks checkpointed";
  }
  if (st.optimizer_moment_bits != st.configured_moment_bits) {
    out += (out.empty() ? "" : ", ") + std::string("AdamW moments in ") + std::to_string(st.optimizer_moment_bits) +
           " bits (inexact)";
  }
  if (st.optimizer_offload) out += (out.empty() ? "" : ", ") + std::string("AdamW moments in host memory");
  return out;
}

}  // namespace trainer::oom_backoff
