#pragma once
// TensorBoard's event files: TFRecord framing (length and data, each with its masked CRC-32C)
// around serialized tensorboard.Event messages (TensorBoard's own event.proto).
#include <cstdint>
#include <cstdio>
#include <string>

namespace trainer::tensorboard {

/// CRC-32C (Castagnoli) of `n` bytes, as TFRecord files use it.
std::uint32_t crc32c(const void* data, std::size_t n);
/// The masked CRC a TFRecord stores: rotated right by 15 bits plus 0xa282ead8.
std::uint32_t masked_crc32c(const void* data, std::size_t n);

/// Appends records to one event file, created new (never an existing one: each writer starts
/// its own `events.out.tfevents.<seconds>.<host>.<pid>.<n>`, which TensorBoard reads in name
/// order). Not thread-safe.
class EventFile {
 public:
  /// Creates the directory and the file; throws trainer::Error naming the path when it cannot.
  explicit EventFile(const std::string& dir);
  ~EventFile();
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;

  /// Appends one record (a serialized Event); false when the write failed (errno says why).
  bool write_record(const std::string& data);
  /// Pushes what was written to the operating system, so that TensorBoard sees it.
  bool flush();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace trainer::tensorboard
