#pragma once
// Edits a zip archive's headers in place, as a hostile file would: for tests of the readers that
// must check what an archive declares before they allocate it. Standard library only.
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

namespace trainer::testing {

/// Sets the uncompressed size that `file`'s zip headers (local and central) declare for each
/// entry whose name ends in `suffix` to `size`, leaving its data as it is; returns how many
/// headers were changed (2 per entry).
inline int declare_zip_entry_size(const std::string& file, const std::string& suffix, std::uint32_t size) {
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  int changed = 0;
  auto u16 = [&](std::size_t at) {
    return static_cast<std::size_t>(static_cast<unsigned char>(bytes[at]) | static_cast<unsigned char>(bytes[at + 1])
                                                                                << 8);
  };
  auto patch_if_named = [&](std::size_t name_at, std::size_t name_len, std::size_t size_at) {
    if (name_at + name_len > bytes.size() || name_len < suffix.size()) return;
    if (bytes.compare(name_at + name_len - suffix.size(), suffix.size(), suffix) != 0) return;
    for (int i = 0; i < 4; ++i) bytes[size_at + i] = static_cast<char>((size >> (8 * i)) & 0xff);
    ++changed;
  };
  for (std::size_t at = 0; at + 46 < bytes.size(); ++at) {
    if (bytes.compare(at, 4, std::string("PK\x03\x04", 4)) == 0) {  // local header: name at 30, size at 22
      patch_if_named(at + 30, u16(at + 26), at + 22);
    } else if (bytes.compare(at, 4, std::string("PK\x01\x02", 4)) == 0) {  // central header: name at 46, size at 24
      patch_if_named(at + 46, u16(at + 28), at + 24);
    }
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  return changed;
}

}  // namespace trainer::testing
