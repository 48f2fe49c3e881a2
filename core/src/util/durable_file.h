#pragma once
// Private: files that survive a crash or a power loss whole or not at all. A file is written
// to `<path>.tmp` (created new, never through a link: trainer/durable_file.h), flushed to the
// disk (fsync) through the descriptor that wrote it, renamed over `<path>`, and the directory is
// flushed too, so that after `publish` returns the new name is on the disk and names complete
// contents. A failure removes the temporary file.
//
// The temporary is never opened again by name (its digest is counted as it is written), so a
// FIFO or a link put at its name after it was created neither blocks the run nor is read. Names
// are still resolved from their full paths on each call: that no folder on the path is replaced
// while a run is in it is assumed, not checked (trainer/durable_file.h).
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

#include "trainer/durable_file.h"
#include "trainer/run_records.h"

namespace trainer::detail {

using trainer::write_atomic;

/// fsync of a directory, so that names created, renamed or removed in it are on the disk.
void sync_dir(const std::string& dir);

/// Renames the finished temporary file `tmp` (written and flushed to the disk by
/// write_temporary or write_temporary_digested) to `path` (same directory), then flushes the
/// directory. Removes `tmp` when either fails.
void publish(const std::string& tmp, const std::string& path);

/// Size and CRC-32 (zlib's) of a file's contents (a checkpoint's digest, trainer/run_records.h).
using FileDigest = CheckpointDigest;
/// The digest of the file at `path`, read by name (a checkpoint found on disk).
FileDigest digest_of(const std::string& path);

/// A finished temporary file: its name, and the digest of the bytes written to it.
struct Temporary {
  std::string path;
  FileDigest digest;
};

/// trainer::write_temporary, with the digest of what `fill` wrote, counted as it went through
/// the descriptor (a checkpoint's digest): the temporary is not read back by name.
Temporary write_temporary_digested(const std::string& path, const std::function<void(std::ostream&)>& fill);

}  // namespace trainer::detail
