#pragma once
// Private: the sink of a run's log files (trainer.log, rank-N.log). spdlog's basic_file_sink
// opens its file by name and would follow a link planted there; this one appends to a file
// opened by trainer::open_for_append (never through a link, only a regular file) and keeps that
// descriptor, so there is no window between the check and the open.
#include <memory>
#include <string>

#include <spdlog/sinks/sink.h>

namespace trainer::detail {

/// A sink appending to `path` (created when missing). Throws UsageError naming the path when a
/// link or anything but a regular file is there, trainer::Error when it cannot be opened.
std::shared_ptr<spdlog::sinks::sink> log_file_sink(const std::string& path);

}  // namespace trainer::detail
