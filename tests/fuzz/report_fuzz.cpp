// libFuzzer target for `trainer report`'s reading of a run directory, which is untrusted input
// (run directories are copied between colleagues): metrics.jsonl, status.json and trainer.log as
// the report reads them, then the page drawn from what was read. Anything but a page (a crash, a
// hang, a sanitizer finding, an exception) is a finding.
//
// An input is the text of metrics.jsonl, then optionally a NUL byte and the text of status.json,
// then optionally another NUL byte and the text of trainer.log.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "report.h"

namespace {

void write(const std::filesystem::path& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return;
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("trainer-report-fuzz-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::size_t first = input.find('\0');
  const std::size_t second = first == std::string::npos ? first : input.find('\0', first + 1);
  write(dir / "metrics.jsonl", input.substr(0, first));
  std::filesystem::remove(dir / "status.json");
  std::filesystem::remove(dir / "trainer.log");
  if (first != std::string::npos) {
    write(dir / "status.json", input.substr(first + 1, second == std::string::npos ? second : second - first - 1));
  }
  if (second != std::string::npos) write(dir / "trainer.log", input.substr(second + 1));
  try {
    const trainer::report::RunData run = trainer::report::read_run(dir.string());
    const std::string page = trainer::report::render_html(run);
    if (page.empty()) __builtin_trap();
  } catch (const trainer::report::ReportError&) {
    // a run directory that cannot be read at all: said, not a finding
  }
  return 0;
}
