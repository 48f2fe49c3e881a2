#pragma once
#include <memory>
#include <string>

#include "trainer/export.h"

namespace spdlog {
class logger;
}

namespace trainer {

/// The process logger "trainer" (stderr). Created on first use.
TRAINER_API std::shared_ptr<spdlog::logger> default_logger();

/// Points the process logger at stderr plus `<run_dir>/trainer.log` (when run_dir is not
/// empty) with `level` ("trace", "debug", "info", "warn", "error", "off"). Throws
/// UsageError for an unknown level.
TRAINER_API std::shared_ptr<spdlog::logger> configure_logging(const std::string& run_dir, const std::string& level);

}  // namespace trainer
