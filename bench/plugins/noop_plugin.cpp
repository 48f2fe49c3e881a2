// Benchmark plugin: subscribes to every event and does nothing but count.
#include "trainer/plugin.h"

namespace {

class NoopPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "noop"; }
  std::vector<trainer::Event> events() const override { return trainer::all_events(); }
  void on_event(trainer::EventContext&, trainer::Control&) override { ++calls_; }

 private:
  std::uint64_t calls_ = 0;
};

}  // namespace

TRAINER_PLUGIN(NoopPlugin)
