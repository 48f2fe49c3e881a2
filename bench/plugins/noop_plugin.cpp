// Benchmark plugin: subscribes to every event and does nothing but count.
#include "trainer/plugin.h"

namespace {

class NoopPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "noop"; }
  std::vector<trainer::Event> events() const override {
    std::vector<trainer::Event> all;
    for (std::size_t i = 0; i < trainer::kNumEvents; ++i) all.push_back(static_cast<trainer::Event>(i));
    return all;
  }
  void on_event(trainer::EventContext&, trainer::Control&) override { ++calls_; }

 private:
  std::uint64_t calls_ = 0;
};

}  // namespace

TRAINER_PLUGIN(NoopPlugin)
