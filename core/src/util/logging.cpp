#include "trainer/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "trainer/error.h"

namespace trainer {

std::shared_ptr<spdlog::logger> default_logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>("trainer", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    l->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ %v");
    l->set_level(spdlog::level::info);
    return l;
  }();
  return logger;
}

std::shared_ptr<spdlog::logger> configure_logging(const std::string& run_dir, const std::string& level) {
  const auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    throw UsageError("unknown log level '" + level + "'; use trace, debug, info, warn, error or off");
  }
  auto logger = default_logger();
  auto& sinks = logger->sinks();
  sinks.resize(1);  // the stderr sink
  if (!run_dir.empty()) {
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(run_dir + "/trainer.log");
    file->set_pattern("%Y-%m-%d %H:%M:%S.%e %-5l %v");
    sinks.push_back(file);
  }
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::warn);
  return logger;
}

}  // namespace trainer
