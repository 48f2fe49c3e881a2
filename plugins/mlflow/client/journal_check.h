#pragma once
// A journal record checked against what the plugin writes: `trainer mlflow sync` treats a run
// directory's journal as untrusted (edited, or copied from someone else) and sends nothing
// the plugin would not.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "trainer/error.h"

namespace trainer::mlflow {

/// A journal record trainer does not write (a journal edited, or copied from someone else):
/// the message names the journal file and line, what is wrong and what is allowed.
/// `trainer mlflow sync` exits with 2.
class JournalError : public trainer::UsageError {
 public:
  using trainer::UsageError::UsageError;
};

/// Checks a journal record against the rules the plugin follows when it writes one, so that a
/// journal from elsewhere can send nothing the plugin would not: a known `op`; metric, param
/// and tag keys valid in MLflow (valid_key) and values within MLflow's limits; batches within
/// MLflow's per-request limits; an artifact's `path` a valid_artifact_path; a `continue`'s
/// `previous_run_dir` absolute; an `end`'s status FINISHED, FAILED or KILLED. Throws
/// JournalError starting with `where` (`RUN_DIR/mlflow/journal.jsonl:12`).
void validate_record(const nlohmann::json& rec, const std::string& where);

/// The file an artifact record names (`file`, relative to `run_dir` or absolute), symlinks
/// resolved; it must lie inside `run_dir` (also resolved). Throws JournalError starting with
/// `where` otherwise. The file need not exist.
std::filesystem::path artifact_source(const std::filesystem::path& run_dir, const std::string& file,
                                      const std::string& where);

}  // namespace trainer::mlflow
