#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/export.h"

namespace trainer {

/// Who holds a device lease, from its holder file.
struct TRAINER_API LeaseHolder {
  std::int64_t pid = 0;
  std::string host;
  bool shared = false;
  std::string since;  ///< local time the lease was taken, "YYYY-mm-dd HH:MM:SS"
  std::string note;   ///< what the holder said about itself (trainer: its run directory)
  /// "pid 1234 (shared, since 2026-11-22 10:00:01, runs/x)".
  std::string describe() const;
};

/// What the lock of a device's lease says now (DeviceLease::probe).
struct TRAINER_API LeaseState {
  bool held = false;                 ///< some process holds the lock
  bool exclusive = false;            ///< ... exclusively (else every holder shares it)
  std::vector<LeaseHolder> holders;  ///< who, from the holder files (may be empty or stale)
};

/// A host-wide lease on one device, so that jobs started together do not pick the same GPU.
///
/// One lock file per device in a directory every job on the host shares
/// (`<dir>/<key>.lock`), locked with flock(2): exclusive, or shared when the job accepts
/// co-location. The kernel drops the lock when the holder exits, however it exits, so a
/// dead job's lease is free at once; its holder file (`<dir>/<key>.<pid>.holder`, which
/// says who holds it) is removed by the next job that takes the lease ("reclaimed").
///
/// The directory is shared by every user's jobs, so it is checked before use: not a
/// symbolic link, a directory, and if others may write to it, with the sticky bit (as /tmp),
/// so nobody but the directory's owner can replace another's files. Files in it are opened
/// without following symbolic links.
class TRAINER_API DeviceLease {
 public:
  /// Takes the lease of `key` (a GPU UUID or bus id; any string, sanitised for a file
  /// name) in `dir` without blocking. Returns null when others hold it in a conflicting
  /// mode and fills `holders` with them. `reclaimed` receives the stale holders removed.
  /// Throws trainer::Error when `dir` cannot be created or written.
  static std::unique_ptr<DeviceLease> try_acquire(const std::string& dir, const std::string& key, bool shared,
                                                  const std::string& note, std::vector<LeaseHolder>* holders = nullptr,
                                                  std::vector<LeaseHolder>* reclaimed = nullptr);
  /// The live holders of `key` (stale holder files are skipped, not removed).
  static std::vector<LeaseHolder> holders(const std::string& dir, const std::string& key);
  /// Whether `key` is leased now, by trying its lock without keeping it: the lock decides, so
  /// a stale holder file, or one whose pid was reused by another process, cannot make a free
  /// device look leased. Throws trainer::Error where try_acquire would.
  static LeaseState probe(const std::string& dir, const std::string& key);
  /// `$TRAINER_LEASE_DIR`, else `/tmp/trainer-leases`.
  static std::string default_dir();

  ~DeviceLease();  ///< releases
  DeviceLease(const DeviceLease&) = delete;
  DeviceLease& operator=(const DeviceLease&) = delete;

  void release();
  const std::string& key() const { return key_; }
  bool shared() const { return shared_; }
  const std::string& lock_path() const { return lock_path_; }

 private:
  DeviceLease() = default;
  int fd_ = -1;
  bool shared_ = false;
  std::string key_, lock_path_, holder_path_;
};

}  // namespace trainer
