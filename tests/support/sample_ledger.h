#pragma once
// A test plugin that records which dataset indices reached each committed optimizer step, in
// order: the samples of a failed attempt (an out-of-memory error) count for nothing.
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/plugin.h"

namespace trainer::testing {

class SampleLedger final : public Plugin {
 public:
  std::string name() const override { return "ledger"; }
  std::vector<Event> events() const override {
    return {Event::BatchStart, Event::AfterBackward, Event::OutOfMemory, Event::AfterOptimizerStep};
  }
  void on_event(EventContext& ctx, Control&) override {
    switch (ctx.event) {
      case Event::BatchStart:
      case Event::OutOfMemory:
        pending_.clear();  // a failed attempt contributes nothing
        break;
      case Event::AfterBackward: {
        const at::Tensor idx = ctx.indices->cpu();
        for (std::int64_t i = 0; i < idx.size(0); ++i) pending_.push_back(idx[i].item<std::int64_t>());
        break;
      }
      case Event::AfterOptimizerStep:
        steps.push_back(pending_);
        pending_.clear();
        break;
      default:
        break;
    }
  }
  /// Every committed step's indices, one after the other.
  std::vector<std::int64_t> committed() const {
    std::vector<std::int64_t> all;
    for (const auto& s : steps) all.insert(all.end(), s.begin(), s.end());
    return all;
  }
  std::vector<std::vector<std::int64_t>> steps;  ///< per committed step, in order

 private:
  std::vector<std::int64_t> pending_;
};

}  // namespace trainer::testing
