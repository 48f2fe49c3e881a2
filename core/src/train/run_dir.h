#pragma once
// Private: the run directory and the files the core writes there besides checkpoints and
// metrics: config.toml and status.json, each written atomically and durably.
#include <cstdint>
#include <string>

#include "trainer/core_settings.h"
#include "trainer/run_records.h"
#include "util/durable_file.h"

namespace trainer {

using detail::write_atomic;

/// `<run.dir>/<run.name>-<YYYYmmdd-HHMMSS>[-N]` (or the directory asked for) with its
/// `checkpoints/` subdirectory.
class RunDir {
 public:
  /// The run's directory: `explicit_dir` when not empty (without trailing slashes), else a new
  /// name under run.dir, which `claim` creates (atomically: this run's alone, even when
  /// another picks the same name in the same second).
  static std::string path_for(const RunSettings& run, const std::string& explicit_dir, bool claim);

  /// Creates `path` and its checkpoints/ directory. Throws UsageError when it cannot, or when
  /// checkpoints/ or memory/ is there but is a link or no directory (make_run_subdir).
  explicit RunDir(std::string path);

  const std::string& path() const { return path_; }
  std::string checkpoints() const { return path_ + "/checkpoints"; }

  /// Removes the directory when it holds nothing but what the core writes before training
  /// (trainer.log, config.toml, status.json, an empty metrics.jsonl, an empty checkpoints/);
  /// returns whether it did. Anything else (a plugin's files) keeps it.
  bool remove_if_only_core_files() const;

  /// Writes status.json (with the time now); an I/O error is returned as text (a run never
  /// fails over it).
  std::string write_status(RunStatusRecord s) const;

 private:
  std::string path_;
};

}  // namespace trainer
