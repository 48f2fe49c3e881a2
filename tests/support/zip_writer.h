#pragma once
// Writes zip archives as PyTorch's writer lays them out, byte by byte: for tests of the readers of
// torch.save files and TorchScript archives, each entry as a test needs it (deflated, declaring
// another size, pointing at another entry's data). Standard library and zlib only.
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::testing {

/// `v` as `bytes` little-endian bytes.
inline std::string le(std::uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

struct ZipEntry {
  std::string name;  ///< under the archive's folder
  std::string data;
  bool deflate = false;
  /// The size read out that the directory declares; the data's own when not set.
  std::optional<std::uint64_t> declared;
  /// Point the directory entry at that entry's local header and data instead of its own.
  int data_of = -1;
};

/// `in` deflated without a zlib header, as zip entries hold it.
inline std::string raw_deflate(const std::string& in) {
  z_stream z{};
  if (deflateInit2(&z, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) throw std::runtime_error("deflateInit2");
  std::string out(deflateBound(&z, in.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw std::runtime_error("deflate");
  return out;
}

/// A zip archive of `entries` under `folder`/, as PyTorch's writer lays it out (local headers
/// and data, the central directory, the end record); sizes past 32 bits go in zip64 extra fields.
inline std::string zip_archive(const std::vector<ZipEntry>& entries, const std::string& folder = "archive") {
  struct Written {
    std::uint64_t offset, packed, size;
    std::uint32_t crc;
  };
  std::string out;
  std::vector<Written> written;
  for (const auto& e : entries) {
    const std::string payload = e.deflate ? raw_deflate(e.data) : e.data;
    const auto crc = static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(e.data.data()), e.data.size()));
    const std::uint64_t size = e.declared.value_or(e.data.size());
    const std::uint64_t packed = e.deflate ? payload.size() : size;
    written.push_back({out.size(), packed, size, crc});
    if (e.data_of >= 0) continue;
    const std::string name = folder + "/" + e.name;
    out += le(0x04034b50, 4) + le(20, 2) + le(0, 2) + le(e.deflate ? 8 : 0, 2) + le(0, 4) + le(crc, 4) +
           le(std::min<std::uint64_t>(packed, 0xFFFFFFFF), 4) + le(std::min<std::uint64_t>(size, 0xFFFFFFFF), 4) +
           le(name.size(), 2) + le(0, 2) + name + payload;
  }
  const std::uint64_t directory_at = out.size();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    Written w = written[i];
    if (e.data_of >= 0) w.offset = written[e.data_of].offset;
    const std::string name = folder + "/" + e.name;
    std::string zip64;
    if (w.size >= 0xFFFFFFFF) zip64 += le(w.size, 8);
    if (w.packed >= 0xFFFFFFFF) zip64 += le(w.packed, 8);
    const std::string extra = zip64.empty() ? "" : le(1, 2) + le(zip64.size(), 2) + zip64;
    out += le(0x02014b50, 4) + le(20, 2) + le(20, 2) + le(0, 2) + le(e.deflate ? 8 : 0, 2) + le(0, 4) + le(w.crc, 4) +
           le(std::min<std::uint64_t>(w.packed, 0xFFFFFFFF), 4) + le(std::min<std::uint64_t>(w.size, 0xFFFFFFFF), 4) +
           le(name.size(), 2) + le(extra.size(), 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 4) + le(w.offset, 4) +
           name + extra;
  }
  const std::uint64_t directory_size = out.size() - directory_at;
  out += le(0x06054b50, 4) + le(0, 2) + le(0, 2) + le(entries.size(), 2) + le(entries.size(), 2) +
         le(directory_size, 4) + le(directory_at, 4) + le(0, 2);
  return out;
}

}  // namespace trainer::testing
