// libFuzzer target for `trainer mlflow sync` replaying an MLflow journal, which is untrusted
// input (run directories are copied between colleagues): the input is RUN_DIR/mlflow/journal.jsonl,
// synced to an MLflow file store in a temporary directory. Exit codes 0 (sent), 2 (refused) and 3
// (left to send) are outcomes; a crash, a hang, a sanitizer finding or an exception escaping
// sync_run_dir is a finding.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>

#include "mlflow_export.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const fs::path root =
      fs::temp_directory_path() / ("trainer-mlflow-journal-fuzz-" + std::to_string(::getpid()));
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)quiet;
  const fs::path run = root / "run", store = root / "store";
  fs::remove_all(root);
  fs::create_directories(trainer::mlflow::journal_dir(run.string()));
  fs::create_directories(store);
  std::FILE* f = std::fopen((trainer::mlflow::journal_dir(run.string()) / "journal.jsonl").c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  std::ostringstream out, err;
  const int code = trainer::mlflow::sync_run_dir(run.string(), "file:" + store.string(), out, err);
  if (code != 0 && code != 2 && code != 3) __builtin_trap();
  return 0;
}
