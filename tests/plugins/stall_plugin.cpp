// Test plugin: a rank that is alive but stuck outside the collectives. On the rank named by
// plugins.stall.rank, BatchEnd (or, with event = "Checkpoint", the writing of the checkpoint) of
// the `at_step`-th optimizer step sleeps `seconds`; the heartbeat thread goes on beating meanwhile.
#include <chrono>
#include <thread>

#include "trainer/distributed.h"
#include "trainer/plugin.h"

namespace {

class StallPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "stall"; }
  std::vector<trainer::Event> events() const override {
    return {checkpoint_ ? trainer::Event::Checkpoint : trainer::Event::BatchEnd};
  }
  std::vector<trainer::KeySpec> config_keys() const override {
    using T = trainer::ValueType;
    return {trainer::KeySpec("rank", T::Int, "The rank that stalls").def(std::int64_t{1}).min(0),
            trainer::KeySpec("at_step", T::Int, "Stall at this optimizer step").def(std::int64_t{3}).min(0),
            trainer::KeySpec("seconds", T::Float, "How long").def(5.0).min(0),
            trainer::KeySpec("event", T::String, "BatchEnd or Checkpoint (rank 0 writing one)")
                .def(std::string("BatchEnd"))
                .choices({"BatchEnd", "Checkpoint"})};
  }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    rank_ = section.get<std::int64_t>("rank");
    at_step_ = section.get<std::int64_t>("at_step");
    seconds_ = section.get<double>("seconds");
    checkpoint_ = section.get<std::string>("event") == "Checkpoint";
  }
  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (trainer::rank_of_this_process() == rank_ && ctx.state.global_step == at_step_) {
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds_));
    }
  }

 private:
  std::int64_t rank_ = 1, at_step_ = 3;
  double seconds_ = 5.0;
  bool checkpoint_ = false;
};

}  // namespace

TRAINER_PLUGIN(StallPlugin)
