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
#include <vector>

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

/// How an archive is laid out and what it may hold compressed.
struct ZipLayout {
  /// torch.save's and LibTorch's: every record under one folder ("resnet50/data.pkl"), named
  /// without it; deflated records are refused by read(). Otherwise (NumPy's .npz) records are
  /// named in full, and read() inflates deflated ones.
  bool torch = true;
  /// Bytes the deflated entries may declare together (their inflated sizes).
  std::uint64_t max_inflated = kMaxInflatedBytes;
  /// In torch's layout, whether read() inflates deflated records: the code/ of a TorchScript
  /// archive (LibTorch deflates it) is read to check it, within max_inflated.
  bool inflate_code = false;
};

/// Deflate expands by at most about 1032:1: an entry declaring more than this many times its
/// compressed bytes (plus a small stream's overhead) cannot be a valid one, however short.
inline constexpr std::uint64_t kMaxDeflateRatio = 1032;

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
  static std::unique_ptr<ZipArchive> open(const std::string& path, const ZipLayout& layout = {});
  ~ZipArchive();
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  /// Whether `name` (under the archive's folder: "data.pkl", "data/0") is a record.
  bool has(const std::string& name) const;
  /// The size of record `name` in bytes (no larger than the file; checked when opened).
  std::uint64_t size(const std::string& name) const;
  /// The records' names, sorted.
  std::vector<std::string> names() const;
  /// Reads record `name` into `dst` (size(name) bytes) and checks its CRC-32. A deflated
  /// record is refused in torch's layout (torch.save stores its records) unless inflate_code,
  /// and inflated otherwise: it must inflate to exactly the size it declares.
  void read(const std::string& name, void* dst) const;
  /// Record `name` as bytes.
  std::string read(const std::string& name) const;

 private:
  struct Entry {
    std::uint64_t offset = 0;  ///< of the data, in the file
    std::uint64_t size = 0;    ///< read out (deflated: declared)
    std::uint32_t crc32 = 0;
    bool deflated = false;
    std::uint64_t packed = 0;  ///< bytes in the archive
  };
  ZipArchive(int fd, std::uint64_t file_size, bool inflate) : fd_(fd), file_size_(file_size), inflate_(inflate) {}
  void inflate(const Entry& e, const std::string& name, void* dst) const;
  void pread_all(std::uint64_t offset, void* dst, std::uint64_t n) const;
  const Entry& entry(const std::string& name) const;

  int fd_ = -1;
  std::uint64_t file_size_ = 0;
  bool inflate_ = false;                  ///< whether read() inflates deflated records
  std::map<std::string, Entry> entries_;  ///< by name under the folder
};

/// Why LibTorch's archive reader must not be given `path`, or nullopt when ZipArchive accepts
/// it. LibTorch's reader (miniz) allocates what an entry declares before reading it; trainer
/// checkpoints and adapter files come with run directories from elsewhere, so each is checked
/// here first: a file that is not a zip archive, and every refusal of ZipArchive::open, are
/// named.
std::optional<std::string> archive_problem(const std::string& path);

}  // namespace trainer::detail
