#pragma once
// Private: the zip archive that Python's torch.save (PyTorch >= 1.6) and LibTorch write, read
// without miniz. The file is untrusted: opening it allocates at most the central directory
// (no larger than the file) and an index of its entries; a record is read only into memory
// its caller allocated for the size the index holds, which opening checked against the file.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace trainer::detail {

/// Bytes that the deflated (compressed) entries of one archive may declare, together. torch.save
/// stores every record uncompressed; LibTorch compresses only the TorchScript code and debug
/// records of a trainer checkpoint (a few KiB). A deflated entry's declared size is what miniz
/// allocates before inflating it, whatever the file's size (deflate packs up to ~1000:1).
inline constexpr std::uint64_t kMaxInflatedBytes = 64ull << 20;

/// A file that is not what torch.save writes, or that holds something the reader refuses: thrown
/// by ZipArchive (the archive) and by read_torch_save (the pickle and tensors in it) alike, so
/// that a caller catches one type.
class TorchSaveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The records of a zip archive as torch.save and LibTorch write it, under one folder
/// ("resnet50/data.pkl"). Read without miniz: the end record, the central directory and every
/// local header are checked against the file before anything is allocated, and a record's
/// bytes are checked against its CRC-32 when read. Refused: encrypted entries, methods other
/// than stored and deflate, deflated entries declaring more than kMaxInflatedBytes together
/// (they are never read here, only by LibTorch for a trainer checkpoint), a stored entry whose
/// two sizes differ, an entry that reaches past the records, entries that overlap (one
/// stretch of the file read as many records), two entries of the same name.
class ZipArchive {
 public:
  /// Opens `path`. nullptr when it is not a zip archive at all (it does not start with a local
  /// file header, as torch.save's pre-1.6 format does not); throws TorchSaveError for a zip
  /// archive it refuses, saying what is wrong.
  static std::unique_ptr<ZipArchive> open(const std::string& path);
  ~ZipArchive();
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  /// Whether `name` (under the archive's folder: "data.pkl", "data/0") is a record.
  bool has(const std::string& name) const;
  /// The size of record `name` in bytes (no larger than the file; checked when opened).
  std::uint64_t size(const std::string& name) const;
  /// Reads record `name` into `dst` (size(name) bytes) and checks its CRC-32. A deflated
  /// record is refused: torch.save stores its records.
  void read(const std::string& name, void* dst) const;
  /// Record `name` as bytes.
  std::string read(const std::string& name) const;

 private:
  struct Entry {
    std::uint64_t offset = 0;  ///< of the data, in the file
    std::uint64_t size = 0;    ///< read out (deflated: declared)
    std::uint32_t crc32 = 0;
    bool deflated = false;
  };
  ZipArchive(int fd, std::uint64_t file_size) : fd_(fd), file_size_(file_size) {}
  void pread_all(std::uint64_t offset, void* dst, std::uint64_t n) const;
  const Entry& entry(const std::string& name) const;

  int fd_ = -1;
  std::uint64_t file_size_ = 0;
  std::map<std::string, Entry> entries_;  ///< by name under the folder
};

/// Why LibTorch's archive reader must not be given `path`, or nullopt when ZipArchive accepts
/// it. LibTorch's reader (miniz) allocates what an entry declares before reading it; trainer
/// checkpoints and adapter files come with run directories from elsewhere, so each is checked
/// here first: a file that is not a zip archive, and every refusal of ZipArchive::open, are
/// named.
std::optional<std::string> archive_problem(const std::string& path);

}  // namespace trainer::detail
