// Test plugin: exports a descriptor claiming another trainer ABI and LibTorch version.
// The host must refuse it before creating anything.
#include <cstring>

#include "trainer/plugin.h"

namespace bad_abi_export {
trainer::AbiDescriptor trainer_plugin_abi() {
  trainer::AbiDescriptor d = trainer::this_abi();
  d.trainer_abi = 999;
  std::snprintf(d.torch_version, sizeof d.torch_version, "%s", "0.0.1");
  return d;
}
trainer::Plugin* trainer_plugin_create() { std::abort(); }  // must never be called
}  // namespace bad_abi_export

BOOST_DLL_ALIAS(bad_abi_export::trainer_plugin_abi, trainer_plugin_abi)
BOOST_DLL_ALIAS(bad_abi_export::trainer_plugin_create, trainer_plugin_create)
