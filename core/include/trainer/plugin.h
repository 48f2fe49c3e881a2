#pragma once
#include <torch/version.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/config_spec.h"
#include "trainer/context.h"
#include "trainer/control.h"
#include "trainer/events.h"
#include "trainer/export.h"
#include "trainer/plugin_state.h"

namespace spdlog {
class logger;
}

/// Bumped whenever a public header changes a layout or a virtual table plugins rely on.
#define TRAINER_ABI_VERSION 17

namespace trainer {

/// What the core does when a plugin's handler throws.
enum class FailurePolicy {
  Observer,   ///< log the error with plugin and event names, then continue the run
  Essential,  ///< fail the run cleanly (Exception and Shutdown fire, exit code 3)
};

/// What Plugin::forward_scope() returns: an object alive around one forward pass and its loss.
/// Its destructor undoes what its constructor did, and must not throw.
class TRAINER_API ForwardScope {
 public:
  virtual ~ForwardScope();
};

/// A plugin: reacts to lifecycle events and may steer the run through Control.
/// Subclass it in a MODULE library and export it with TRAINER_PLUGIN(Class).
class TRAINER_API Plugin {
 public:
  virtual ~Plugin();
  /// Unique name; also the config section `plugins.<name>`.
  virtual std::string name() const = 0;
  virtual std::string version() const { return "0.1.0"; }
  virtual std::string description() const { return {}; }
  /// The events on_event() wants; the bus calls it for these only. Read after configure(), so
  /// the settings may narrow them (a plugin handling AfterBackward keeps a data-parallel run
  /// from overlapping its gradients' all-reduce with the backward).
  virtual std::vector<Event> events() const = 0;
  /// Keys of `plugins.<name>`; `priority` and `policy` are always accepted in addition.
  virtual std::vector<KeySpec> config_keys() const { return {}; }
  /// Lower runs first among opening events (ties: load order); closing events reverse it.
  virtual int default_priority() const { return 0; }
  virtual FailurePolicy default_policy() const { return FailurePolicy::Observer; }
  /// Called once after the config is validated, before Init. `section` is `plugins.<name>`
  /// with defaults filled in.
  virtual void configure(const Config& section, std::shared_ptr<spdlog::logger> logger) {
    (void)section;
    logger_ = std::move(logger);
  }
  /// Handles one event. May throw: the bus reports it with the plugin and event names.
  virtual void on_event(EventContext& ctx, Control& control) = 0;
  /// What this plugin must remember across a resume (Lightning's state_dict). Called each
  /// time the run writes a checkpoint; the values are stored in it under the plugin's name.
  /// Leave `state` empty to store nothing.
  virtual void save_state(PluginState& state) { (void)state; }
  /// Gets back what save_state() stored, when `--resume` loads a checkpoint holding state for
  /// this plugin: after configure(), before the Resume event (which lists the plugins restored).
  virtual void load_state(const PluginState& state) { (void)state; }
  /// Wraps each forward the core runs, like PyTorch's `with torch.autocast(...)` around the
  /// model call (Lightning's precision plugin forward_context): called after BeforeForward
  /// for a training micro-batch (ctx.event == BeforeForward) and after EvalBatchStart for an
  /// evaluation batch (ctx.event == EvalBatchStart; fired then even when no plugin subscribes),
  /// with ctx.batch set. The scope returned lives until the loss is computed and is destroyed
  /// on every exit path, an out-of-memory error or any exception in the forward included.
  /// Scopes of several plugins nest: opened in priority order, closed in reverse. Return null
  /// (the default) for nothing. May throw, handled by the plugin's failure policy.
  virtual std::unique_ptr<ForwardScope> forward_scope(const EventContext& ctx) {
    (void)ctx;
    return nullptr;
  }

 protected:
  std::shared_ptr<spdlog::logger> logger_;
};

/// The structs that cross the plugin boundary, in the order of AbiDescriptor::struct_sizes.
inline constexpr const char* kAbiStructNames[] = {"EventContext", "Control",    "RunState",      "OomInfo",
                                                  "MemoryStats",  "Batch",      "KeySpec",       "Plugin",
                                                  "PluginState",  "ResumeInfo", "ControlReason", "DataSpec"};
inline constexpr std::size_t kAbiStructCount = sizeof kAbiStructNames / sizeof kAbiStructNames[0];

/// Plain-C description of how a plugin was built, read before any C++ object crosses the
/// boundary. The host refuses a plugin whose ABI, LibTorch version, C++ ABI or shared struct
/// sizes differ (the sizes catch a layout change whose TRAINER_ABI_VERSION bump was forgotten).
struct AbiDescriptor {
  std::uint32_t trainer_abi;
  char torch_version[32];
  std::int32_t cxx11_abi;  ///< _GLIBCXX_USE_CXX11_ABI
  char compiler[96];
  std::uint32_t struct_sizes[kAbiStructCount];  ///< sizeof of each of kAbiStructNames
};

/// The descriptor of the code that includes this header (the plugin's or the host's).
inline AbiDescriptor this_abi() {
  AbiDescriptor d{};
  d.trainer_abi = TRAINER_ABI_VERSION;
  std::snprintf(d.torch_version, sizeof d.torch_version, "%s", TORCH_VERSION);
#ifdef _GLIBCXX_USE_CXX11_ABI
  d.cxx11_abi = _GLIBCXX_USE_CXX11_ABI;
#else
  d.cxx11_abi = -1;
#endif
#if defined(__clang__)
  std::snprintf(d.compiler, sizeof d.compiler, "clang %s", __clang_version__);
#elif defined(__GNUC__)
  std::snprintf(d.compiler, sizeof d.compiler, "gcc %s", __VERSION__);
#else
  std::snprintf(d.compiler, sizeof d.compiler, "unknown");
#endif
  const std::size_t sizes[] = {sizeof(EventContext), sizeof(Control),    sizeof(RunState),      sizeof(OomInfo),
                               sizeof(MemoryStats),  sizeof(Batch),      sizeof(KeySpec),       sizeof(Plugin),
                               sizeof(PluginState),  sizeof(ResumeInfo), sizeof(ControlReason), sizeof(DataSpec)};
  static_assert(sizeof sizes / sizeof sizes[0] == kAbiStructCount, "one size per name in kAbiStructNames");
  for (std::size_t i = 0; i < kAbiStructCount; ++i) d.struct_sizes[i] = static_cast<std::uint32_t>(sizes[i]);
  return d;
}

using PluginAbiFn = AbiDescriptor();
using PluginCreateFn = Plugin*();

}  // namespace trainer

#include <boost/dll/alias.hpp>  // NOLINT: needed by TRAINER_PLUGIN only

/// Exports `Class` (a trainer::Plugin with a default constructor) from a plugin library:
/// the factory `trainer_plugin_create` and the descriptor `trainer_plugin_abi`.
/// NOTE: the functions live in a namespace: BOOST_DLL_ALIAS of a global function with the
/// alias's own name compiles, but the alias then points at itself and calling it crashes.
#define TRAINER_PLUGIN(Class)                                                     \
  namespace trainer_plugin_export {                                               \
  ::trainer::AbiDescriptor trainer_plugin_abi() { return ::trainer::this_abi(); } \
  ::trainer::Plugin* trainer_plugin_create() { return new Class(); }              \
  }                                                                               \
  BOOST_DLL_ALIAS(trainer_plugin_export::trainer_plugin_abi, trainer_plugin_abi)  \
  BOOST_DLL_ALIAS(trainer_plugin_export::trainer_plugin_create, trainer_plugin_create)
