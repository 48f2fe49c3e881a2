#include "trainer/logging.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "trainer/durable_file.h"
#include "trainer/error.h"
#include "trainer/secrets.h"
#include "util/log_file_sink.h"

namespace trainer {

namespace {

/// basic_file_sink's writes and flushes (stdio-buffered, flushed when the logger flushes), over a
/// file opened safely: see util/log_file_sink.h.
class AppendFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit AppendFileSink(const std::string& path) : path_(path) {
    FileDescriptor fd = open_for_append(path);
    file_ = ::fdopen(fd.get(), "ab");
    TRAINER_CHECK(file_ != nullptr, "cannot open the log file ", path, ": ", std::strerror(errno));
    fd.release();  // the FILE owns it
  }
  ~AppendFileSink() override { std::fclose(file_); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    if (std::fwrite(formatted.data(), 1, formatted.size(), file_) != formatted.size()) {
      spdlog::throw_spdlog_ex("Failed writing to file " + path_, errno);
    }
  }
  void flush_() override {
    if (std::fflush(file_) != 0) spdlog::throw_spdlog_ex("Failed flush to file " + path_, errno);
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

/// A logger whose lines never hold a URI's credentials: a message that quotes a URI the user gave
/// (a tracking server's, an error about it) reaches every sink without its "user:password@".
class RedactingLogger final : public spdlog::logger {
 public:
  using spdlog::logger::logger;
  std::shared_ptr<spdlog::logger> clone(std::string name) override {
    auto copy = std::make_shared<RedactingLogger>(*this);
    copy->name_ = std::move(name);
    return copy;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    if (payload.find("://") == std::string_view::npos || payload.find('@') == std::string_view::npos) {
      spdlog::logger::sink_it_(msg);
      return;
    }
    const std::string cut = without_userinfo(payload);
    spdlog::details::log_msg redacted_msg = msg;
    redacted_msg.payload = spdlog::string_view_t(cut.data(), cut.size());
    spdlog::logger::sink_it_(redacted_msg);
  }
};

}  // namespace

namespace detail {
std::shared_ptr<spdlog::sinks::sink> log_file_sink(const std::string& path) {
  return std::make_shared<AppendFileSink>(path);
}
}  // namespace detail

std::shared_ptr<spdlog::logger> default_logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    std::shared_ptr<spdlog::logger> l =
        std::make_shared<RedactingLogger>("trainer", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
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
    auto file = detail::log_file_sink(run_dir + "/trainer.log");
    file->set_pattern("%Y-%m-%d %H:%M:%S.%e %-5l %v");
    sinks.push_back(file);
  }
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::warn);
  return logger;
}

}  // namespace trainer
