// Test plugin: its constructor throws an int, not a std::exception. The host must report it
// as a plugin error naming the library.
#include "trainer/plugin.h"

namespace {

class ThrowingFactoryPlugin final : public trainer::Plugin {
 public:
  ThrowingFactoryPlugin() { throw 42; }
  std::string name() const override { return "throwing_factory"; }
  std::vector<trainer::Event> events() const override { return {}; }
  void on_event(trainer::EventContext&, trainer::Control&) override {}
};

}  // namespace

TRAINER_PLUGIN(ThrowingFactoryPlugin)
