#pragma once
// A plugin that makes chosen training steps run out of memory in their forward or loss, for
// tests of the recovery.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "trainer/memory.h"
#include "trainer/plugin.h"

namespace trainer::testing {

/// Makes the first attempt of each step in `steps` (counted from 0) run out of memory in its
/// forward or loss (a real refused allocation: the budget before the forward is what is in use
/// plus `headroom` bytes). At OutOfMemory it records the phase and message, lifts the budget and
/// asks for half the micro-batch; the configured size comes back at the next batch.
class Squeeze final : public Plugin {
 public:
  explicit Squeeze(std::set<std::int64_t> steps, std::int64_t headroom = 1024)
      : steps_(std::move(steps)), headroom_(headroom) {}
  std::string name() const override { return "squeeze"; }
  std::vector<Event> events() const override { return {Event::BeforeForward, Event::OutOfMemory, Event::BatchStart}; }
  int default_priority() const override { return -100; }
  void on_event(EventContext& ctx, Control& c) override {
    if (ctx.event == Event::OutOfMemory) {
      set_memory_limit(c10::Device(c10::kCPU), 0);
      ++ooms;
      phases.push_back(ctx.oom->phase);
      messages.push_back(ctx.oom->message);
      c.retry_with_micro_batch = ctx.oom->micro_batch_size / 2;
      return;
    }
    if (ctx.event == Event::BatchStart) {
      if (configured_ > 0) c.micro_batch_size = configured_;
      if (configured_ == 0) configured_ = ctx.state.micro_batch_size;
      done_ = false;
      return;
    }
    if (steps_.count(ctx.state.global_step) != 0 && !done_) {
      done_ = true;
      set_memory_limit(c10::Device(c10::kCPU), memory_stats(c10::Device(c10::kCPU)).allocated + headroom_);
    }
  }
  int ooms = 0;
  std::vector<OomPhase> phases;
  std::vector<std::string> messages;

 private:
  std::set<std::int64_t> steps_;
  std::int64_t headroom_;
  std::int64_t configured_ = 0;
  bool done_ = false;
};

}  // namespace trainer::testing
