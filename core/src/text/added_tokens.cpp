// Added tokens: matched leftmost-longest, split out with their single_word, lstrip and rstrip
// rules, as tokenizers 0.15 does.
#include "text/added_tokens.h"

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include "text/unicode.h"

namespace trainer::text::detail {

std::vector<std::int32_t> AddedTokens::longest_starts(const std::string& s, std::size_t& lookups) const {
  // Read backwards, the automaton's longest string ending at byte i is the longest token,
  // written backwards, that starts at i.
  std::vector<std::int32_t> out(s.size(), -1);
  std::int32_t node = 0;
  for (std::size_t i = s.size(); i-- > 0;) {
    node = reversed_.step(node, s[i], lookups);
    out[i] = reversed_.longest(node).first;
  }
  return out;
}

std::size_t AddedTokens::split(const std::string& s, std::vector<Segment>& out) const {
  if (empty() || s.empty()) {
    out.push_back({s, -1});
    return 0;
  }
  if (!reversed_.linked()) throw std::logic_error("AddedTokens::split before finish()");
  std::size_t lookups = 0;
  const std::vector<std::int32_t> longest = longest_starts(s, lookups);
  const auto whitespace_at = [&](std::size_t i, std::size_t& len) {
    // The code point at byte i, when it is whitespace (its length in `len`).
    const auto b = static_cast<unsigned char>(s[i]);
    len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    return in_class(CharClass::kBertWhitespace, decode_utf8(std::string_view(s).substr(i, len))[0]);
  };
  const auto char_before = [&](std::size_t i) {
    std::size_t k = i;
    do {
      --k;
    } while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80);
    return decode_utf8(std::string_view(s).substr(k, i - k))[0];
  };
  std::size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    const AddedToken* best = nullptr;
    std::size_t at = pos;
    for (; at < s.size(); ++at) {
      if ((static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) continue;  // inside a character
      if (longest[at] >= 0) {
        best = &tokens_[static_cast<std::size_t>(longest[at])];
        break;
      }
    }
    if (best == nullptr) break;
    std::size_t start = at, stop = at + best->content.size();
    pos = stop;
    if (best->single_word) {
      const bool space_before = start == 0 || !in_class(CharClass::kWord, char_before(start));
      const bool space_after =
          stop == s.size() ||
          !in_class(CharClass::kWord,
                    decode_utf8(std::string_view(s).substr(stop, std::min<std::size_t>(4, s.size() - stop)))[0]);
      if (!space_before || !space_after) continue;
    }
    if (best->lstrip) {
      std::size_t k = start;
      while (k > 0) {
        std::size_t p = k;
        do {
          --p;
        } while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80);
        std::size_t len = 0;
        if (!whitespace_at(p, len)) break;
        k = p;
      }
      start = std::max(k, start_offset);
    }
    if (best->rstrip) {
      std::size_t len = 0;
      while (stop < s.size() && whitespace_at(stop, len)) stop += len;
    }
    if (start_offset < start) out.push_back({s.substr(start_offset, start - start_offset), -1});
    out.push_back({std::string(), best->id});
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({s.substr(start_offset), -1});
  return lookups;
}

}  // namespace trainer::text::detail
