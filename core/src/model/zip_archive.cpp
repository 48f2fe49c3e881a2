// The zip archive torch.save and LibTorch write, read without miniz: every size and offset the
// file declares is checked against the file before anything is allocated for it.
#include "model/zip_archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

namespace trainer::detail {

namespace {

constexpr std::uint32_t kLocalSignature = 0x04034b50, kCentralSignature = 0x02014b50, kEndSignature = 0x06054b50,
                        kZip64EndSignature = 0x06064b50, kZip64LocatorSignature = 0x07064b50;
constexpr std::uint64_t kLocalHeaderBytes = 30, kCentralHeaderBytes = 46, kEndBytes = 22, kZip64LocatorBytes = 20,
                        kZip64EndBytes = 56;
/// The end record is the last 22 bytes but for a comment of at most 65535: where it is looked for.
constexpr std::uint64_t kEndSearchBytes = kEndBytes + 0xFFFF;
/// 32-bit fields at this value are in the entry's zip64 extra field.
constexpr std::uint64_t kZip64Marker = 0xFFFFFFFF;

std::uint64_t little_endian(const unsigned char* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t(p[i]) << (8 * i);
  return v;
}

/// Bytes of an entry's name shown in a message; longer names are cut.
constexpr std::size_t kShownNameBytes = 100;

/// An entry's name as shown in a message: at most kShownNameBytes of it.
std::string shown(const std::string& name) {
  return "'" + (name.size() > kShownNameBytes ? name.substr(0, kShownNameBytes) + "..." : name) + "'";
}

[[noreturn]] void refuse_zip(const std::string& what) { throw TorchSaveError("a damaged zip archive: " + what); }

}  // namespace

ZipArchive::~ZipArchive() {
  if (fd_ >= 0) ::close(fd_);
}

void ZipArchive::pread_all(std::uint64_t offset, void* dst, std::uint64_t n) const {
  auto* out = static_cast<char*>(dst);
  while (n > 0) {
    const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(n, 1ull << 30));
    const ssize_t got = ::pread(fd_, out, chunk, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw TorchSaveError("the file ends before the " + std::to_string(n) + " bytes at byte " +
                           std::to_string(offset) + " its zip directory points to (" +
                           (got < 0 ? std::string(std::strerror(errno)) : "changed while being read?") + ")");
    }
    out += got;
    offset += static_cast<std::uint64_t>(got);
    n -= static_cast<std::uint64_t>(got);
  }
}

std::unique_ptr<ZipArchive> ZipArchive::open(const std::string& path, const ZipLayout& layout) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw TorchSaveError(std::string("cannot be opened (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw TorchSaveError("is not a regular file");
  }
  const bool inflate = !layout.torch || layout.inflate_code;
  std::unique_ptr<ZipArchive> zip(new ZipArchive(fd, static_cast<std::uint64_t>(st.st_size), inflate));
  const std::uint64_t file = zip->file_size_;
  unsigned char head[4];
  if (file < sizeof head) return nullptr;
  zip->pread_all(0, head, sizeof head);
  if (little_endian(head, 4) != kLocalSignature) return nullptr;

  // The end record: the last one in the file's tail, as miniz (LibTorch's reader) takes it.
  const std::uint64_t tail_bytes = std::min(file, kEndSearchBytes);
  std::string tail(tail_bytes, '\0');
  zip->pread_all(file - tail_bytes, tail.data(), tail_bytes);
  const auto* t = reinterpret_cast<const unsigned char*>(tail.data());
  std::uint64_t end_at = 0;
  bool found = false;
  for (std::uint64_t i = tail_bytes >= kEndBytes ? tail_bytes - kEndBytes + 1 : 0; i-- > 0;) {
    if (little_endian(t + i, 4) == kEndSignature) {
      end_at = file - tail_bytes + i;
      found = true;
      break;
    }
  }
  if (!found) refuse_zip("no end-of-central-directory record in its last 64 KiB (a truncated file?)");
  const unsigned char* end = t + (end_at - (file - tail_bytes));
  std::uint64_t count = little_endian(end + 10, 2), directory_size = little_endian(end + 12, 4),
                directory_at = little_endian(end + 16, 4), directory_limit = end_at;
  // Zip64 (archives past 4 GiB or 65535 entries): a locator just before the end record.
  if (end_at >= kZip64LocatorBytes) {
    unsigned char locator[kZip64LocatorBytes];
    zip->pread_all(end_at - kZip64LocatorBytes, locator, sizeof locator);
    if (little_endian(locator, 4) == kZip64LocatorSignature) {
      const std::uint64_t at = little_endian(locator + 8, 8);
      if (at > end_at - kZip64LocatorBytes || end_at - kZip64LocatorBytes - at < kZip64EndBytes) {
        refuse_zip("its zip64 end record (at byte " + std::to_string(at) + ") is not before its locator");
      }
      unsigned char end64[kZip64EndBytes];
      zip->pread_all(at, end64, sizeof end64);
      if (little_endian(end64, 4) != kZip64EndSignature) refuse_zip("no zip64 end record where its locator points");
      count = little_endian(end64 + 32, 8);
      directory_size = little_endian(end64 + 40, 8);
      directory_at = little_endian(end64 + 48, 8);
      directory_limit = at;
    }
  }
  if (directory_at > directory_limit || directory_size > directory_limit - directory_at) {
    refuse_zip("its central directory (" + std::to_string(directory_size) + " bytes at byte " +
               std::to_string(directory_at) + ") reaches past its end record (byte " + std::to_string(directory_limit) +
               " of " + std::to_string(file) + ")");
  }
  if (count > directory_size / kCentralHeaderBytes) {
    refuse_zip(std::to_string(count) + " entries declared in a central directory of " + std::to_string(directory_size) +
               " bytes (" + std::to_string(kCentralHeaderBytes) + " at least each)");
  }
  std::string directory(directory_size, '\0');  // at most the file's size: checked above
  zip->pread_all(directory_at, directory.data(), directory_size);
  const auto* d = reinterpret_cast<const unsigned char*>(directory.data());

  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // [local header, end of data) of each entry
  spans.reserve(count);
  std::string folder;
  std::uint64_t at = 0, inflated = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    const unsigned char* h = d + at;
    if (directory_size - at < kCentralHeaderBytes || little_endian(h, 4) != kCentralSignature) {
      refuse_zip("central directory entry " + std::to_string(i) + " (at byte " + std::to_string(directory_at + at) +
                 ") is not one");
    }
    const std::uint64_t flags = little_endian(h + 8, 2), method = little_endian(h + 10, 2),
                        name_bytes = little_endian(h + 28, 2), extra_bytes = little_endian(h + 30, 2),
                        comment_bytes = little_endian(h + 32, 2);
    const auto crc = static_cast<std::uint32_t>(little_endian(h + 16, 4));
    std::uint64_t packed = little_endian(h + 20, 4), size = little_endian(h + 24, 4), local = little_endian(h + 42, 4);
    if (directory_size - at - kCentralHeaderBytes < name_bytes + extra_bytes + comment_bytes) {
      refuse_zip("central directory entry " + std::to_string(i) + " is cut short");
    }
    const std::string name(reinterpret_cast<const char*>(h + kCentralHeaderBytes), name_bytes);
    // Zip64 extra field (id 1): the 64-bit values of the fields marked 0xFFFFFFFF, in this order.
    for (const unsigned char *e = h + kCentralHeaderBytes + name_bytes, *e_end = e + extra_bytes; e_end - e >= 4;) {
      const std::uint64_t id = little_endian(e, 2), len = little_endian(e + 2, 2);
      if (len > static_cast<std::uint64_t>(e_end - e - 4))
        refuse_zip("the extra field of entry " + shown(name) + " is cut short");
      if (id == 1) {
        const unsigned char* v = e + 4;
        std::uint64_t left = len;
        for (std::uint64_t* field : {&size, &packed, &local}) {
          if (*field != kZip64Marker) continue;
          if (left < 8) refuse_zip("the zip64 field of entry " + shown(name) + " is cut short");
          *field = little_endian(v, 8);
          v += 8;
          left -= 8;
        }
      }
      e += 4 + len;
    }
    const std::string entry = "entry " + shown(name);
    if (flags & 1) refuse_zip(entry + " is encrypted");
    if (method == 8) {
      if (inflate && size > 64 && (size - 64) / kMaxDeflateRatio > packed) {
        refuse_zip(entry + " declares " + std::to_string(size) + " bytes inflated from " + std::to_string(packed) +
                   ": more than deflate can expand them to");
      }
      if (size > layout.max_inflated - inflated) {
        refuse_zip(entry + " is deflated to " + std::to_string(size) + " declared bytes, past the " +
                   std::to_string(layout.max_inflated) + " that compressed entries may declare together" +
                   (layout.torch
                        ? " (torch.save compresses nothing; LibTorch only a trainer checkpoint's few KiB of code)"
                        : ""));
      }
      inflated += size;
    } else if (method != 0) {
      refuse_zip(entry + " is compressed with method " + std::to_string(method) +
                 "; torch.save stores its records, LibTorch deflates a few");
    } else if (packed != size) {
      refuse_zip(entry + " is stored but says it is " + std::to_string(packed) + " bytes in the archive and " +
                 std::to_string(size) + " bytes read out");
    }
    if (local > directory_at || directory_at - local < kLocalHeaderBytes) {
      refuse_zip(entry + "'s local header (at byte " + std::to_string(local) + ") is not before the central directory");
    }
    unsigned char lh[kLocalHeaderBytes];
    zip->pread_all(local, lh, sizeof lh);
    if (little_endian(lh, 4) != kLocalSignature)
      refuse_zip("no local header where " + entry + " says (byte " + std::to_string(local) + ")");
    const std::uint64_t data = local + kLocalHeaderBytes + little_endian(lh + 26, 2) + little_endian(lh + 28, 2);
    if (data > directory_at || packed > directory_at - data) {
      refuse_zip(entry + " declares " + std::to_string(packed) + " bytes at byte " + std::to_string(data) +
                 ", past the end of the records (byte " + std::to_string(directory_at) + " of a file of " +
                 std::to_string(file) + " bytes)");
    }
    spans.emplace_back(local, data + packed);
    // Records are named under the first entry's folder, as LibTorch's reader names them.
    if (i == 0 && layout.torch) {
      const std::size_t slash = name.find('/');
      if (slash == std::string::npos) refuse_zip("its first " + entry + " is not in a folder, as torch.save's are");
      folder = name.substr(0, slash + 1);
    }
    if (name.compare(0, folder.size(), folder) == 0 &&
        !zip->entries_.emplace(name.substr(folder.size()), Entry{data, size, crc, method == 8, packed}).second) {
      refuse_zip("two entries named " + shown(name));
    }
    at += kCentralHeaderBytes + name_bytes + extra_bytes + comment_bytes;
  }
  // Disjoint entries: together they hold at most the file's bytes, however many there are.
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) {
      refuse_zip("two entries overlap (bytes " + std::to_string(spans[i - 1].first) + " to " +
                 std::to_string(spans[i - 1].second) + " and from " + std::to_string(spans[i].first) +
                 "): one stretch of the file read as several records");
    }
  }
  return zip;
}

const ZipArchive::Entry& ZipArchive::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw TorchSaveError("no " + shown(name) + " in the archive");
  return it->second;
}

bool ZipArchive::has(const std::string& name) const { return entries_.count(name) > 0; }

std::uint64_t ZipArchive::size(const std::string& name) const { return entry(name).size; }

std::vector<std::string> ZipArchive::names() const {
  std::vector<std::string> out;
  for (const auto& kv : entries_) out.push_back(kv.first);
  return out;
}

void ZipArchive::inflate(const Entry& e, const std::string& name, void* dst) const {
  std::string packed(e.packed, '\0');  // at most the file's size: checked when opened
  pread_all(e.offset, packed.data(), e.packed);
  z_stream zs{};
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) throw TorchSaveError("zlib could not start inflating " + shown(name));
  auto* in = reinterpret_cast<Bytef*>(packed.data());
  auto* out = static_cast<Bytef*>(dst);
  std::uint64_t in_left = e.packed, out_left = e.size;
  int rc = Z_OK;
  while (rc == Z_OK) {
    // zlib counts in 32 bits: feed and take at most 1 GiB at a time.
    if (zs.avail_in == 0 && in_left > 0) {
      zs.next_in = in;
      zs.avail_in = static_cast<uInt>(std::min<std::uint64_t>(in_left, 1u << 30));
      in += zs.avail_in;
      in_left -= zs.avail_in;
    }
    if (zs.avail_out == 0 && out_left > 0) {
      zs.next_out = out;
      zs.avail_out = static_cast<uInt>(std::min<std::uint64_t>(out_left, 1u << 30));
      out += zs.avail_out;
      out_left -= zs.avail_out;
    }
    rc = ::inflate(&zs, Z_NO_FLUSH);
    if (rc == Z_BUF_ERROR && (zs.avail_in > 0 || in_left > 0) && (zs.avail_out > 0 || out_left > 0)) rc = Z_OK;
  }
  const std::uint64_t produced = e.size - out_left - zs.avail_out;
  const std::string zlib_says = zs.msg ? zs.msg : "";
  inflateEnd(&zs);
  if (rc != Z_STREAM_END || produced != e.size || zs.avail_in != 0 || in_left != 0) {
    throw TorchSaveError(
        "record " + shown(name) + " does not inflate to the " + std::to_string(e.size) + " bytes it declares (" +
        (rc == Z_STREAM_END ? std::to_string(produced) + " bytes"
                            : "a damaged deflate stream" + (zlib_says.empty() ? "" : ": " + zlib_says)) +
        ")");
  }
}

void ZipArchive::read(const std::string& name, void* dst) const {
  const Entry& e = entry(name);
  if (e.deflated && !inflate_)
    throw TorchSaveError("record " + shown(name) + " is compressed; torch.save stores its records");
  if (e.deflated) {
    inflate(e, name, dst);
  } else {
    pread_all(e.offset, dst, e.size);
  }
  uLong crc = ::crc32(0L, Z_NULL, 0);
  for (std::uint64_t done = 0; done < e.size;) {
    const auto n = static_cast<uInt>(std::min<std::uint64_t>(e.size - done, 1u << 30));
    crc = ::crc32(crc, static_cast<const Bytef*>(dst) + done, n);
    done += n;
  }
  if (static_cast<std::uint32_t>(crc) != e.crc32) {
    std::ostringstream os;
    os << "record " << shown(name) << " is damaged (its CRC-32 is " << std::hex << crc << ", the archive says "
       << e.crc32 << ")";
    throw TorchSaveError(os.str());
  }
}

std::string ZipArchive::read(const std::string& name) const {
  std::string out(size(name), '\0');
  read(name, out.data());
  return out;
}

std::optional<std::string> archive_problem(const std::string& path) {
  try {
    if (!ZipArchive::open(path)) return std::string("it is not a zip archive (the format LibTorch writes)");
  } catch (const TorchSaveError& e) {
    return std::string("its archive is refused: ") + e.what();
  }
  return std::nullopt;
}

}  // namespace trainer::detail
