// Test plugin: a backward inside the backward. In AfterForward it hooks the logits' gradient;
// when the backward reaches them, the hook runs a backward of its own on zero times the model's
// last parameter (the head's bias), which accumulates into that parameter's gradient before
// the outer backward does so again. The training is unchanged (it adds zeros); a data-parallel
// run that overlaps its all-reduce with the backward sees that parameter's gradient accumulated
// twice, the second time after its bucket's all-reduce started.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "trainer/plugin.h"

namespace {

class ReentrantGradPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "reentrant_grad"; }
  std::vector<trainer::Event> events() const override { return {trainer::Event::AfterForward}; }
  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (!ctx.outputs->requires_grad()) return;
    at::Tensor last = ctx.model->parameters().back();
    ctx.outputs->register_hook([last](const at::Tensor&) {
      c10::AutoGradMode grad(true);
      (last * 0.0).sum().backward();
    });
  }
};

}  // namespace

TRAINER_PLUGIN(ReentrantGradPlugin)
