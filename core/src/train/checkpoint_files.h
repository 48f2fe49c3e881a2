#pragma once
// Private: checkpoint files on disk. Each `step_<N>.pt` is published durably (see
// util/durable_file.h) and then described by its digest `step_<N>.pt.sum` (size and CRC-32),
// so a file damaged or cut short later is recognised before it is loaded. `latest` names the
// newest complete one.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace trainer {

/// `step_00000042.pt`.
std::string checkpoint_name(std::int64_t global_step);

/// Writes the checkpoint `file` durably: `save` writes `<file>.tmp`, the file is published,
/// then its digest goes to `<file>.sum` (an older digest of that name is removed first). A
/// failure removes the temporary file; a file of that name that was there stays, without a
/// digest (it is then judged by loading it).
void write_checkpoint_file(const std::string& file, const std::function<void(const std::string& tmp)>& save);

/// Points `<dir>/latest` at `name` (durably).
void point_latest(const std::string& dir, const std::string& name);

/// Removes a checkpoint and its digest.
void remove_checkpoint(const std::string& file);

/// Why `file` cannot be a complete checkpoint (missing, empty, its contents differ from its
/// digest, or an archive that LibTorch's reader must not be given: detail::archive_problem),
/// or nullopt when nothing says so.
std::optional<std::string> checkpoint_problem(const std::string& file);

/// What `--resume PATH` may load, most wanted first. A file: that file only (`explicit_file`).
/// A run directory (or its checkpoints/ directory): the one `latest` names, then every other
/// `step_<N>.pt` there, newest first, to fall back on when the newer ones are not complete.
struct ResumeCandidates {
  std::vector<std::string> files;
  bool explicit_file = false;
};
/// Throws UsageError when the path does not exist or holds no checkpoint; `setting` (the
/// option or key the path came from) starts the message.
ResumeCandidates resume_candidates(const std::string& path, const std::string& setting = "--resume");

}  // namespace trainer
