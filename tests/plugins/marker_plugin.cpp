// Test plugin: marks that its library was loaded. Its constructor function, which runs when the
// library is loaded (before trainer can check anything of it), creates the file named by
// $TRAINER_TEST_MARKER; the plugin itself does nothing.
#include <cstdio>
#include <cstdlib>

#include "trainer/plugin.h"

namespace {

__attribute__((constructor)) void mark_loaded() {
  const char* path = std::getenv("TRAINER_TEST_MARKER");
  if (path == nullptr) return;
  if (std::FILE* f = std::fopen(path, "w")) std::fclose(f);
}

class MarkerPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "marker"; }
  std::vector<trainer::Event> events() const override { return {}; }
  void on_event(trainer::EventContext&, trainer::Control&) override {}
};

}  // namespace

TRAINER_PLUGIN(MarkerPlugin)
