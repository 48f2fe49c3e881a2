// A SentencePiece model's normalization tables, checked before libsentencepiece reads them: it
// walks the precompiled character map (a Darts double-array trie over the text's bytes, then
// the NUL-terminated strings it maps to) without bounds checks, so a crafted map reads outside
// the file's memory on the first text encoded. Every unit the walk can reach and every string
// it can point to is checked against the map's size here.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "text/sentencepiece_model.h"
#include "trainer/error.h"

namespace trainer::text::detail {

namespace {

/// A protocol buffer's varint at `at`, or false when the bytes end first.
bool varint(std::string_view b, std::size_t& at, std::uint64_t& out) {
  out = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (at >= b.size()) return false;
    const auto byte = static_cast<unsigned char>(b[at++]);
    out |= std::uint64_t{byte & 0x7Fu} << shift;
    if (byte < 0x80) return true;
  }
  return false;
}

/// The length-delimited fields numbered `field` of message `b`; false when it is not a
/// well-formed message (libsentencepiece's parser then refuses it).
bool fields(std::string_view b, std::uint64_t field, std::vector<std::string_view>& out) {
  std::size_t at = 0;
  while (at < b.size()) {
    std::uint64_t key = 0, n = 0;
    if (!varint(b, at, key)) return false;
    switch (key & 7) {
      case 0:
        if (!varint(b, at, n)) return false;
        break;
      case 1:
        if (b.size() - at < 8) return false;
        at += 8;
        break;
      case 5:
        if (b.size() - at < 4) return false;
        at += 4;
        break;
      case 2:
        if (!varint(b, at, n) || n > b.size() - at) return false;
        if ((key >> 3) == field) out.push_back(b.substr(at, static_cast<std::size_t>(n)));
        at += static_cast<std::size_t>(n);
        break;
      default:
        return false;
    }
  }
  return true;
}

std::uint32_t unit_at(std::string_view trie, std::size_t i) {
  std::uint32_t u = 0;
  std::memcpy(&u, trie.data() + 4 * i, 4);  // little-endian, as the file is (x86-64, aarch64)
  return u;
}
// Darts-clone's unit fields.
bool has_leaf(std::uint32_t u) { return ((u >> 8) & 1) == 1; }
std::uint32_t value(std::uint32_t u) { return u & ((1u << 31) - 1); }
std::uint32_t label(std::uint32_t u) { return u & ((1u << 31) | 0xFF); }
std::uint32_t offset(std::uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

/// Empty when the precompiled map is safe to walk, else what is wrong.
std::string check_charsmap(std::string_view blob) {
  if (blob.empty()) return {};
  if (blob.size() <= 4) return "a character map of " + std::to_string(blob.size()) + " bytes";
  std::uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, blob.data(), 4);
  if (trie_bytes > blob.size() - 4 || trie_bytes % 4 != 0 || trie_bytes == 0) {
    return "a character map whose trie size (" + std::to_string(trie_bytes) + " bytes) does not fit its " +
           std::to_string(blob.size()) + " bytes";
  }
  const std::string_view trie = blob.substr(4, trie_bytes), strings = blob.substr(4 + trie_bytes);
  const std::size_t n = trie.size() / 4;
  std::vector<bool> seen(n, false);
  std::vector<std::size_t> pending;
  const std::size_t root = offset(unit_at(trie, 0));  // the walk starts at 0 ^ offset(unit 0)
  if (root >= n) return "a character map whose trie leaves its units at the root";
  pending.push_back(root);
  seen[root] = true;
  while (!pending.empty()) {
    const std::size_t p = pending.back();
    pending.pop_back();
    for (std::uint32_t c = 0; c < 256; ++c) {
      const std::size_t q = p ^ c;
      if (q >= n) return "a character map whose trie reads past its units";
      const std::uint32_t u = unit_at(trie, q);
      if (label(u) != c) continue;
      const std::size_t next = q ^ offset(u);
      if (next >= n) return "a character map whose trie reads past its units";
      if (has_leaf(u)) {
        const std::uint32_t v = value(unit_at(trie, next));
        if (v >= strings.size() || strings.find('\0', v) == std::string_view::npos) {
          return "a character map that points past its strings";
        }
      }
      if (!seen[next]) {
        seen[next] = true;
        pending.push_back(next);
      }
    }
  }
  return {};
}

}  // namespace

void check_normalizers(const std::string& model, const std::string& name) {
  // ModelProto: normalizer_spec = 3, denormalizer_spec = 5; NormalizerSpec.precompiled_charsmap = 2.
  std::vector<std::string_view> specs;
  if (!fields(model, 3, specs) || !fields(model, 5, specs)) return;  // not a message: the library says so
  for (const auto spec : specs) {
    std::vector<std::string_view> maps;
    if (!fields(spec, 2, maps)) continue;
    for (const auto m : maps) {
      const std::string wrong = check_charsmap(m);
      TRAINER_CHECK_T(UsageError, wrong.empty(), name, ": not a SentencePiece model that can be read safely (", wrong,
                      ")");
    }
  }
}

}  // namespace trainer::text::detail
