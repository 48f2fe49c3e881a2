// Test plugin: a NaN on one rank of a data-parallel run. At the `at_step`-th batch (counted from
// 1), the rank named by plugins.nonfinite.rank multiplies the tensor its backward runs on by NaN
// (its gradients, then every rank's once summed, are NaN), and the rank named by skip_rank (-1:
// none) asks to skip that optimizer step in GradientsAccumulated: the ranks then disagree
// locally (one would skip, the other diverge) and must still end the same way.
#include <limits>

#include "trainer/distributed.h"
#include "trainer/plugin.h"

namespace {

class NonfinitePlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "nonfinite"; }
  std::vector<trainer::Event> events() const override {
    using E = trainer::Event;
    return {E::BatchStart, E::BeforeBackward, E::GradientsAccumulated};
  }
  std::vector<trainer::KeySpec> config_keys() const override {
    using T = trainer::ValueType;
    return {
        trainer::KeySpec("rank", T::Int, "The rank whose loss for backward becomes NaN").def(std::int64_t{1}).min(0),
        trainer::KeySpec("skip_rank", T::Int, "The rank that asks to skip that step; -1: none")
            .def(std::int64_t{-1})
            .min(-1),
        trainer::KeySpec("at_step", T::Int, "At this batch, counted from 1").def(std::int64_t{3}).min(1)};
  }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    rank_ = section.get<std::int64_t>("rank");
    skip_rank_ = section.get<std::int64_t>("skip_rank");
    at_ = section.get<std::int64_t>("at_step");
  }
  void on_event(trainer::EventContext& ctx, trainer::Control& control) override {
    if (ctx.event == trainer::Event::BatchStart) ++batch_;
    if (batch_ != at_) return;
    const std::int64_t me = trainer::rank_of_this_process();
    if (ctx.event == trainer::Event::BeforeBackward && me == rank_) {
      *ctx.backward_loss = *ctx.backward_loss * std::numeric_limits<double>::quiet_NaN();
    }
    if (ctx.event == trainer::Event::GradientsAccumulated && me == skip_rank_) {
      control.skip_step = true;
      control.reason = "nonfinite test plugin";
    }
  }

 private:
  std::int64_t rank_ = 1, skip_rank_ = -1, at_ = 3, batch_ = 0;
};

}  // namespace

TRAINER_PLUGIN(NonfinitePlugin)
