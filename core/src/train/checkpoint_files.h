#pragma once
// Private: checkpoint files on disk. Each `step_<N>.pt` is published durably (see
// util/durable_file.h) and then described by its digest `step_<N>.pt.sum` (size and CRC-32),
// so a file damaged or cut short later is recognised before it is loaded. `latest` names the
// newest complete one.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace trainer {

/// `step_00000042.pt`.
std::string checkpoint_name(std::int64_t global_step);

/// Writes the checkpoint `file` durably: `save` writes `<file>.tmp` (created new:
/// trainer::write_temporary) through `out`, the file is published,
/// then its digest (of the bytes `save` wrote) goes to `<file>.sum` (an older digest of that
/// name is removed first). A
/// failure removes the temporary file; a file of that name that was there stays, without a
/// digest (it is then judged by loading it).
void write_checkpoint_file(const std::string& file, const std::function<void(std::ostream& out)>& save);

/// Points `<dir>/latest` at `name` (durably).
void point_latest(const std::string& dir, const std::string& name);

/// Points `<dir>/best` at `name` (durably): the best checkpoint by checkpoint.monitor.
void point_best(const std::string& dir, const std::string& name);

/// `<file>.score`: the value of the metric `monitor` the checkpoint was written with (durably).
void write_score(const std::string& file, const std::string& monitor, double score);
/// The score of `file` by `monitor`; nullopt when it has none, one by another metric, or one that
/// cannot be read (its first 512 bytes at most: a run directory may come from someone else).
std::optional<double> read_score(const std::string& file, const std::string& monitor);

/// Removes a checkpoint, its digest and its score.
void remove_checkpoint(const std::string& file);

/// Why `file` cannot be a complete checkpoint (missing, empty, its contents differ from its
/// digest, or an archive that LibTorch's reader must not be given: detail::archive_problem),
/// or nullopt when nothing says so.
std::optional<std::string> checkpoint_problem(const std::string& file);

/// Whether `run_dir` holds checkpoints to resume from: `checkpoints/latest` or a
/// `checkpoints/step_<N>.pt` (complete or not: resuming says which it can load).
bool holds_checkpoints(const std::string& run_dir);

/// A run that resumes in place from `file`, a `step_<N>.pt` of its own checkpoints directory
/// `dir`, goes on from there: the step files newer than `file` (written after it by the run
/// before, whose course this one leaves) move with their digests and scores to
/// `dir/superseded_after_step_<N>[-K]/`, where neither `latest` nor a later resume finds them,
/// and `latest` names `file`. Returns the step files left, oldest first (empty when `file` is
/// not a step file of `dir`: nothing is moved), and in `moved` what went where.
std::vector<std::string> adopt_checkpoints(const std::string& dir, const std::string& file, std::string& moved);

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
