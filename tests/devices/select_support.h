#pragma once
// Runs the real device_select plugin (loaded from its .so) through an EventBus, the way the
// trainer does at SelectDevice, with the plugin's settings given as TOML lines. Shared by the
// in-process tests and by device_select_probe (the concurrent-process lease test).
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <string>

#include "trainer/config_spec.h"
#include "trainer/event_bus.h"
#include "trainer/plugin_host.h"
#include "trainer/trainer.h"

namespace trainer::testing {

/// What one SelectDevice dispatch did.
struct SelectOutcome {
  std::string device;  ///< Control.switch_device ("" when the plugin threw)
  int exit_code = 0;   ///< the ExitRequest / UsageError code when it threw, else 0
  std::string error;   ///< the exception's message
  std::string log;     ///< everything the plugin logged
};

/// A loaded, configured device_select plugin and the bus it runs on; Shutdown on destruction
/// (which releases its lease).
class DeviceSelect {
 public:
  /// `settings`: TOML lines of [plugins.device_select], e.g. "min_free_mb = 100".
  explicit DeviceSelect(const std::string& settings, const std::string& run_dir = "test-run")
      : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(log_)),
        logger_(std::make_shared<spdlog::logger>("device_select_test", sink_)) {
    logger_->set_level(spdlog::level::debug);
    logger_->set_pattern("%v");
    plugin_ = PluginHost({TRAINER_TEST_PLUGIN_DIR}).load("device_select");
    cfg_ = Config::parse("[plugins.device_select]\n" + settings + "\n");
    const auto problems = validate_config(cfg_, plugin_config_sections({plugin_}));
    if (!problems.empty()) throw ConfigError(problems);
    bus_ = std::make_unique<EventBus>(logger_);
    plugin_->configure(cfg_.sub("plugins.device_select"), logger_);
    bus_->add(plugin_);
    ctx_.config = &cfg_;
    ctx_.logger = logger_;
    ctx_.run_dir = run_dir;
  }
  ~DeviceSelect() {
    try {
      ctx_.event = Event::Shutdown;
      Control c;
      bus_->dispatch(ctx_, c);
    } catch (...) {
    }
  }

  SelectOutcome select() {
    SelectOutcome out;
    ctx_.event = Event::SelectDevice;
    Control c;
    try {
      bus_->dispatch(ctx_, c);
      out.device = c.switch_device.value_or("");
    } catch (const ExitRequest& e) {
      out.exit_code = e.exit_code();
      out.error = e.what();
    } catch (const UsageError& e) {
      out.exit_code = kExitUsage;
      out.error = e.what();
    }
    logger_->flush();
    out.log = log_.str();
    return out;
  }

  /// ModelToDevice after the run moved to `device` (as an out-of-memory device fallback
  /// does); returns everything logged so far.
  std::string moved_to(const std::string& device) {
    ctx_.event = Event::ModelToDevice;
    ctx_.device = c10::Device(device);
    Control c;
    bus_->dispatch(ctx_, c);
    logger_->flush();
    return log_.str();
  }

 private:
  std::ostringstream log_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<Plugin> plugin_;
  Config cfg_;
  std::unique_ptr<EventBus> bus_;
  EventContext ctx_;
};

}  // namespace trainer::testing
