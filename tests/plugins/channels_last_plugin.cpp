// Test plugin: on the rank named by plugins.channels_last.rank, stores the model's 4-D parameters
// channels-last (NHWC) in the event named by plugins.channels_last.event (ModelCreated: before
// model.memory_format is applied; ModelToDevice: after). That rank then holds its model in
// another layout than rank 0's, as when each rank's memory-format probe timed the formats its
// own way: the weights rank 0 broadcasts must still arrive as the same values.
#include <ATen/ATen.h>

#include "trainer/distributed.h"
#include "trainer/plugin.h"

namespace {

class ChannelsLastPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "channels_last"; }
  std::vector<trainer::Event> events() const override {
    return {trainer::Event::ModelCreated, trainer::Event::ModelToDevice};
  }
  std::vector<trainer::KeySpec> config_keys() const override {
    using T = trainer::ValueType;
    return {trainer::KeySpec("rank", T::Int, "The rank whose model goes channels-last").def(std::int64_t{1}).min(0),
            trainer::KeySpec("event", T::String, "ModelCreated or ModelToDevice")
                .def(std::string("ModelCreated"))
                .choices({"ModelCreated", "ModelToDevice"})};
  }
  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    rank_ = section.get<std::int64_t>("rank");
    at_ = section.get<std::string>("event") == "ModelCreated" ? trainer::Event::ModelCreated
                                                              : trainer::Event::ModelToDevice;
  }
  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    if (ctx.event != at_ || trainer::rank_of_this_process() != rank_) return;
    at::NoGradGuard no_grad;
    for (auto& p : ctx.model->parameters()) {
      if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
    }
  }

 private:
  std::int64_t rank_ = 1;
  trainer::Event at_ = trainer::Event::ModelCreated;
};

}  // namespace

TRAINER_PLUGIN(ChannelsLastPlugin)
