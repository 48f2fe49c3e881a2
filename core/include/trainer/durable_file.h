#pragma once
/// Files trainer (and its plugins) write in a run directory. A run directory is untrusted input:
/// it may come from someone else (`--resume`, `trainer report`) or sit where another user can
/// write, so any name in it may hold a symbolic link planted to make a write land elsewhere, or a
/// FIFO that blocks whoever opens it. Every file written there goes through these functions:
///
/// 1. a file written whole (a temporary, a file started afresh) is created new: whatever is at
///    its name goes first, and the open (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0644) neither follows
///    a link nor takes a file that appeared in between;
/// 2. a file appended to (or a lock file, read and written in place) is opened `O_NOFOLLOW` and
///    must be a regular file (checked with fstat on the open descriptor: no window between the
///    check and the use);
/// 3. a file written durably goes through such a temporary, is flushed to the disk and renamed
///    over its name (a link there is replaced, not followed), then the directory is flushed;
/// 4. a folder trainer keeps in a run directory (`checkpoints/`, `memory/`, `mlflow/`) must be a
///    directory, not a link to one.
///
/// A temporary is flushed through the descriptor that wrote it and never opened again by name.
/// What is assumed, not checked: each name is resolved from its full path on every call, and
/// O_NOFOLLOW guards only its last component, so no folder on that path (the run directory, the
/// folders above it, and `checkpoints/`, `memory/`, `mlflow/` once make_run_subdir checked them)
/// may be replaced, by a link or another folder, by another user while a run is in it.
///
/// No LibTorch here: `trainer report` and the MLflow client use the same functions.
#include <cstddef>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>

#include "trainer/export.h"

namespace trainer {

/// An open file descriptor, closed when this goes (move-only).
class TRAINER_API FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const noexcept { return fd_; }
  /// Hands the descriptor over (to fdopen, a sink): this no longer closes it.
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset() noexcept;

 private:
  int fd_ = -1;
};

/// Creates `path` new, for writing (mode 0644 before the umask): whatever is at the name (a
/// leftover, a link, a FIFO) is removed first. A directory there, or anything put at the name
/// between the removal and the creation, is refused (UsageError, exit code 2, naming the path and
/// what is there); another failure throws trainer::Error naming the path and errno.
TRAINER_API FileDescriptor create_new_file(const std::string& path);

/// Opens `path` to append to it, creating it (mode 0644) when missing. A symbolic link or
/// anything but a regular file there is refused (UsageError, exit code 2, naming the path and
/// what is there); another failure throws trainer::Error naming the path and errno.
TRAINER_API FileDescriptor open_for_append(const std::string& path);

/// Opens `path` for reading and writing in place (created, mode 0644, when missing; not
/// truncated), under the rules of open_for_append: a lock file.
TRAINER_API FileDescriptor open_for_update(const std::string& path);

/// Writes all `n` bytes of `data` to `fd` (retrying short writes and EINTR); throws
/// trainer::Error naming `path` and errno.
TRAINER_API void write_fully(int fd, const void* data, std::size_t n, const std::string& path);

/// Writes `text` to `path` durably through `<path>.tmp` (steps 1 and 3 above): never
/// half-written, never lost once this returns. Throws trainer::Error naming the file; a failure
/// removes the temporary.
TRAINER_API void write_atomic(const std::string& path, const std::string& text);

/// The same, the contents written by `fill` into a stream over the temporary (for writers that
/// take a std::ostream: LibTorch's OutputArchive::save_to, jit::Module::save). An exception from
/// `fill` or a failed write removes the temporary and throws, naming `path`.
TRAINER_API void write_atomic(const std::string& path, const std::function<void(std::ostream&)>& fill);

/// As write_atomic, without the flushes to the disk: readers see the old file or the new one,
/// never half of one, but a crash may lose the new one. For a file rewritten after every record
/// sent (MLflow's sent.json), where a flush each time would cost more than a resend.
TRAINER_API void write_replacing(const std::string& path, const std::string& text);

/// Writes `<path>.tmp` (step 1) with `fill`, flushes it to the disk (fsync, through the
/// descriptor that wrote it, before closing it) and returns its name, for a caller that looks at
/// the finished file before it takes `path`'s place and then publishes it (the core's durable
/// rename). A failure removes the temporary and throws, naming `path`.
TRAINER_API std::string write_temporary(const std::string& path, const std::function<void(std::ostream&)>& fill);

/// Makes `dir`, a folder trainer keeps inside a run directory (its parent must exist), or
/// accepts the directory there. A symbolic link or another kind of file at that name is refused
/// (UsageError, exit code 2, naming it); another failure throws trainer::Error.
TRAINER_API void make_run_subdir(const std::string& dir);

}  // namespace trainer
