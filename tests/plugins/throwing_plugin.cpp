// Test plugin: throws std::runtime_error in the event named by plugins.throwing.event
// (from the `at_step`-th optimizer step on); its failure policy comes from the config.
#include <stdexcept>

#include "trainer/plugin.h"

namespace {

class ThrowingPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "throwing"; }
  std::vector<trainer::Event> events() const override { return trainer::all_events(); }
  std::vector<trainer::KeySpec> config_keys() const override {
    using T = trainer::ValueType;
    return {trainer::KeySpec("event", T::String, "Event to throw in").def(std::string("BatchEnd")),
            trainer::KeySpec("at_step", T::Int, "Throw once global_step >= this").def(std::int64_t{0}).min(0)};
  }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    event_ = *trainer::event_from_name(section.get<std::string>("event"));
    at_step_ = section.get<std::int64_t>("at_step");
  }
  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (ctx.event == event_ && ctx.state.global_step >= at_step_) {
      throw std::runtime_error("injected failure at step " + std::to_string(ctx.state.global_step));
    }
  }

 private:
  trainer::Event event_ = trainer::Event::BatchEnd;
  std::int64_t at_step_ = 0;
};

}  // namespace

TRAINER_PLUGIN(ThrowingPlugin)
