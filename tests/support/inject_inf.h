#pragma once
// A test plugin that puts an inf into the first parameter's gradient in the backward of step
// `step`, before mixed_precision's GradScaler unscales, and snapshots the parameters (on the
// host) around that batch; it also records the autocast state inside every training forward.
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "trainer/plugin.h"
#include "trainer/precision.h"

namespace trainer::testing {

class InjectInf final : public Plugin {
 public:
  explicit InjectInf(std::int64_t step) : step_(step) {}
  std::string name() const override { return "inject_inf"; }
  std::vector<Event> events() const override { return {Event::BatchStart, Event::AfterBackward, Event::BatchEnd}; }
  // AfterBackward is a closing event: above mixed_precision's 1000 it runs before the
  // unscaling; and this forward scope opens inside mixed_precision's.
  int default_priority() const override { return 2000; }
  std::unique_ptr<ForwardScope> forward_scope(const EventContext& ctx) override {
    if (ctx.event == Event::BeforeForward) autocast.push_back(autocast_state());
    return nullptr;
  }
  void on_event(EventContext& ctx, Control&) override {
    // A skipped step keeps global_step: the batch index tells the next batch apart.
    if (ctx.state.global_step != step_ || ctx.state.batch_in_epoch != step_) return;
    if (ctx.event == Event::AfterBackward) {
      ctx.model->parameters().front().mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
      return;
    }
    auto& into = ctx.event == Event::BatchStart ? before : after;
    into.clear();
    for (const auto& p : ctx.model->parameters()) into.push_back(p.detach().cpu().clone());
  }
  std::vector<at::Tensor> before, after;
  std::vector<AutocastState> autocast;

 private:
  std::int64_t step_;
};

}  // namespace trainer::testing
