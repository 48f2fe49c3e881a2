#pragma once
// Private: files that survive a crash or a power loss whole or not at all. A file is written
// to `<path>.tmp` (created new, never through a link: trainer/durable_file.h), flushed to the
// disk (fsync), renamed over `<path>`, and the directory is flushed too, so that after `publish`
// returns the new name is on the disk and names complete contents. A failure removes the
// temporary file.
#include <cstdint>
#include <string>

#include "trainer/durable_file.h"
#include "trainer/run_records.h"

namespace trainer::detail {

using trainer::write_atomic;

/// fsync of a file's contents; throws trainer::Error naming the file.
void sync_file(const std::string& path);
/// fsync of a directory, so that names created, renamed or removed in it are on the disk.
void sync_dir(const std::string& dir);

/// Makes the finished temporary file `tmp` durable and renames it to `path` (same
/// directory): fsync(tmp), rename, fsync(directory). Removes `tmp` when any of it fails.
void publish(const std::string& tmp, const std::string& path);

/// Size and CRC-32 (zlib's) of a file's contents (a checkpoint's digest, trainer/run_records.h).
using FileDigest = CheckpointDigest;
FileDigest digest_of(const std::string& path);

}  // namespace trainer::detail
