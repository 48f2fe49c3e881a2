// Test plugin: counts the samples and the correctly classified ones it sees in EvalBatchEnd
// and adds them in EvalMetrics as eval/plugin_samples and eval/plugin_accuracy. In a
// data-parallel run each rank sees its part; the counts are summed over ctx.group, so the
// metrics cover every sample.
#include <ATen/ATen.h>

#include "trainer/distributed.h"
#include "trainer/plugin.h"

namespace {

class EvalCountPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "eval_count"; }
  std::vector<trainer::Event> events() const override {
    return {trainer::Event::EvalStart, trainer::Event::EvalBatchEnd, trainer::Event::EvalMetrics};
  }
  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    switch (ctx.event) {
      case trainer::Event::EvalStart:  // also at a retried evaluation's start
        samples_ = correct_ = 0;
        break;
      case trainer::Event::EvalBatchEnd:
        samples_ += ctx.batch->size();
        correct_ += ctx.outputs->argmax(1).eq(ctx.batch->targets).sum().item<std::int64_t>();
        break;
      case trainer::Event::EvalMetrics: {
        std::vector<at::Tensor> sums{at::tensor({double(samples_), double(correct_)}, at::kDouble)};
        if (ctx.group) ctx.group->all_reduce_sum(sums);
        const double n = sums[0][0].item<double>(), c = sums[0][1].item<double>();
        (*ctx.eval_metrics)["eval/plugin_samples"] = n;
        (*ctx.eval_metrics)["eval/plugin_accuracy"] = n > 0 ? c / n : 0.0;
        break;
      }
      default:
        break;
    }
  }

 private:
  std::int64_t samples_ = 0, correct_ = 0;
};

}  // namespace

TRAINER_PLUGIN(EvalCountPlugin)
