// Test plugin: the right trainer ABI version, but an EventContext of another size, as a
// plugin built against headers whose layout changed without a TRAINER_ABI_VERSION bump would
// report. The host must refuse it before creating anything.
#include <cstdlib>

#include "trainer/plugin.h"

namespace bad_layout_export {
trainer::AbiDescriptor trainer_plugin_abi() {
  trainer::AbiDescriptor d = trainer::this_abi();
  d.struct_sizes[0] += 8;  // EventContext grew a member
  return d;
}
trainer::Plugin* trainer_plugin_create() { std::abort(); }  // must never be called
}  // namespace bad_layout_export

BOOST_DLL_ALIAS(bad_layout_export::trainer_plugin_abi, trainer_plugin_abi)
BOOST_DLL_ALIAS(bad_layout_export::trainer_plugin_create, trainer_plugin_create)
