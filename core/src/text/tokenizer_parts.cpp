#include "text/tokenizer_parts.h"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <utility>

#include "text/unicode.h"

namespace trainer::text::detail {

void Normalizer::apply(std::u32string& s) const {
  switch (kind) {
    case Kind::kBert: {
      if (clean_text) {
        std::u32string out;
        out.reserve(s.size());
        for (const char32_t c : s) {
          if (in_class(CharClass::kCleanRemoved, c) || c == 0 || c == 0xFFFD) continue;
          out.push_back(in_class(CharClass::kCleanSpace, c) ? U' ' : c);
        }
        s.swap(out);
      }
      if (chinese_chars) {
        std::u32string out;
        out.reserve(s.size());
        for (const char32_t c : s) {
          if (is_cjk_ideograph(c)) {
            out.push_back(U' ');
            out.push_back(c);
            out.push_back(U' ');
          } else {
            out.push_back(c);
          }
        }
        s.swap(out);
      }
      if (strip_accents) {
        std::u32string out = nfd(s);
        out.erase(
            std::remove_if(out.begin(), out.end(), [](char32_t c) { return in_class(CharClass::kNonspacingMark, c); }),
            out.end());
        s.swap(out);
      }
      if (lowercase) s = text::lowercase(s);
      return;
    }
    case Kind::kLowercase:
      s = text::lowercase(s);
      return;
    case Kind::kNfd:
      s = nfd(s);
      return;
    case Kind::kStripAccents:
      s.erase(std::remove_if(s.begin(), s.end(), [](char32_t c) { return in_class(CharClass::kCombiningMark, c); }),
              s.end());
      return;
    case Kind::kSequence:
      for (const auto& step : steps) step.apply(s);
      return;
  }
}

namespace {

/// Splits each word at the characters `split` says, dropping them (`keep` false) or keeping
/// each as a word of its own.
template <class F>
void split_words(std::vector<std::u32string>& words, F split, bool keep) {
  std::vector<std::u32string> out;
  out.reserve(words.size());
  for (const auto& w : words) {
    std::u32string cur;
    for (const char32_t c : w) {
      if (split(c)) {
        if (!cur.empty()) out.push_back(std::move(cur));
        cur.clear();
        if (keep) out.emplace_back(1, c);
      } else {
        cur.push_back(c);
      }
    }
    if (!cur.empty()) out.push_back(std::move(cur));
  }
  words.swap(out);
}

bool is_letter(char32_t c) { return in_class(CharClass::kPatternLetter, c); }
bool is_number(char32_t c) { return in_class(CharClass::kPatternNumber, c); }
bool is_space(char32_t c) { return in_class(CharClass::kPatternSpace, c); }

}  // namespace

char32_t byte_char(unsigned char b) {
  static const auto table = [] {
    std::vector<char32_t> t(256, 0);
    std::vector<bool> printable(256, false);
    for (int c = '!'; c <= '~'; ++c) printable[c] = true;
    for (int c = 0xA1; c <= 0xAC; ++c) printable[c] = true;
    for (int c = 0xAE; c <= 0xFF; ++c) printable[c] = true;
    char32_t next = 256;
    for (int c = 0; c < 256; ++c) t[c] = printable[c] ? static_cast<char32_t>(c) : next++;
    return t;
  }();
  return table[b];
}

std::vector<std::u32string> byte_level_split(const std::u32string& s) {
  std::vector<std::u32string> out;
  const std::size_t n = s.size();
  std::size_t i = 0;
  const auto run = [&](std::size_t from, auto pred) {
    std::size_t j = from;
    while (j < n && pred(s[j])) ++j;
    return j;
  };
  const auto other = [](char32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); };
  while (i < n) {
    std::size_t end = i;
    // The contractions, as written (lower case, ASCII apostrophe).
    if (s[i] == U'\'' && i + 1 < n) {
      const char32_t a = s[i + 1];
      if (a == U's' || a == U't' || a == U'm' || a == U'd') {
        end = i + 2;
      } else if (i + 2 < n && ((a == U'r' && s[i + 2] == U'e') || (a == U'v' && s[i + 2] == U'e') ||
                               (a == U'l' && s[i + 2] == U'l'))) {
        end = i + 3;
      }
    }
    if (end == i) {
      const std::size_t j = s[i] == U' ' && i + 1 < n ? i + 1 : i;  // the optional leading space
      if (is_letter(s[j])) {
        end = run(j, is_letter);
      } else if (is_number(s[j])) {
        end = run(j, is_number);
      } else if (other(s[j])) {
        end = run(j, other);
      } else if (is_letter(s[i])) {
        end = run(i, is_letter);
      } else if (is_number(s[i])) {
        end = run(i, is_number);
      } else if (other(s[i])) {
        end = run(i, other);
      }
    }
    if (end == i) {
      // Whitespace: the run, less its last character when something other than whitespace
      // follows it (that character then leads the next word), at least one character.
      const std::size_t j = run(i, is_space);
      end = j == n || j - i == 1 ? j : j - 1;
    }
    out.emplace_back(s.substr(i, end - i));
    i = end;
  }
  return out;
}

void PreTokenizer::apply(std::vector<std::u32string>& words) const {
  switch (kind) {
    case Kind::kBert:
      split_words(
          words, [](char32_t c) { return in_class(CharClass::kBertWhitespace, c); }, false);
      split_words(
          words, [](char32_t c) { return in_class(CharClass::kBertPunctuation, c); }, true);
      return;
    case Kind::kWhitespaceSplit:
      split_words(
          words, [](char32_t c) { return in_class(CharClass::kBertWhitespace, c); }, false);
      return;
    case Kind::kByteLevel: {
      std::vector<std::u32string> out;
      for (auto& w : words) {
        if (add_prefix_space && !w.empty() && w.front() != U' ') w.insert(w.begin(), U' ');
        if (use_regex) {
          for (auto& part : byte_level_split(w)) out.push_back(std::move(part));
        } else if (!w.empty()) {
          out.push_back(std::move(w));
        }
      }
      for (auto& w : out) {
        const std::string bytes = encode_utf8(w);
        w.clear();
        for (const char b : bytes) w.push_back(byte_char(static_cast<unsigned char>(b)));
      }
      words.swap(out);
      return;
    }
    case Kind::kSequence:
      for (const auto& step : steps) step.apply(words);
      return;
  }
}

void WordPiece::tokenize(const std::string& word, std::vector<std::int64_t>& out) const {
  std::size_t chars = 0;
  for (const char b : word) chars += (static_cast<unsigned char>(b) & 0xC0) != 0x80;
  if (chars > max_chars) {
    out.push_back(unk_id);
    return;
  }
  const std::size_t first = out.size();
  std::string piece;
  for (std::size_t start = 0; start < word.size();) {
    // No piece longer than the longest token can match: start there (on a character's start).
    std::size_t end = std::min(word.size(), start + longest);
    while (end > start && end < word.size() && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) --end;
    bool found = false;
    while (start < end) {
      piece.assign(start > 0 ? prefix : std::string());
      piece.append(word, start, end - start);
      const auto it = vocab.find(piece);
      if (it != vocab.end()) {
        out.push_back(it->second);
        found = true;
        break;
      }
      do {
        --end;  // back to the start of the last character
      } while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80);
    }
    if (!found) {
      out.resize(first);
      out.push_back(unk_id);
      return;
    }
    start = end;
  }
}

void Bpe::tokenize(const std::string& word, std::vector<std::int64_t>& out) const {
  if (word.empty()) return;
  struct Symbol {
    std::uint32_t id;
    std::int64_t prev, next;
    std::size_t len;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](std::uint32_t id, std::size_t len) {
    const auto n = static_cast<std::int64_t>(symbols.size());
    if (!symbols.empty()) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };
  // A pending unknown token (fused with the next when fuse_unk): its id and length.
  bool unk = false;
  std::uint32_t unk_token = 0;
  std::size_t unk_len = 0;
  std::string s;
  for (std::size_t i = 0; i < word.size();) {
    std::size_t len = 1;
    while (i + len < word.size() && (static_cast<unsigned char>(word[i + len]) & 0xC0) == 0x80) ++len;
    s.assign(i > 0 ? prefix : std::string());
    s.append(word, i, len);
    if (i + len == word.size()) s += suffix;
    i += len;
    const auto it = vocab.find(s);
    if (it != vocab.end()) {
      if (unk) add(unk_token, unk_len);
      unk = false;
      add(static_cast<std::uint32_t>(it->second), len);
      continue;
    }
    if (byte_fallback) {
      std::vector<std::uint32_t> bytes;
      for (const char b : s) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned char>(b));
        const auto f = vocab.find(name);
        if (f == vocab.end()) break;
        bytes.push_back(static_cast<std::uint32_t>(f->second));
      }
      if (bytes.size() == s.size()) {
        for (const auto b : bytes) add(b, 1);
        continue;
      }
    }
    if (unk_id) {
      if (unk && fuse_unk) {
        unk_len += len;
      } else {
        if (unk) add(unk_token, unk_len);
        unk = true;
        unk_token = static_cast<std::uint32_t>(*unk_id);
        unk_len = len;
      }
    }
  }
  if (unk) add(unk_token, unk_len);

  struct Candidate {
    std::uint32_t rank;
    std::size_t pos;
    std::uint32_t id;
    bool operator<(const Candidate& o) const {  // the queue's top: lowest rank, then leftmost
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const auto key = [](std::uint32_t a, std::uint32_t b) { return (std::uint64_t{a} << 32) | b; };
  std::priority_queue<Candidate> queue;
  for (std::size_t k = 0; k + 1 < symbols.size(); ++k) {
    const auto m = merges.find(key(symbols[k].id, symbols[k + 1].id));
    if (m != merges.end()) queue.push({m->second.rank, k, m->second.id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const auto next_pos = static_cast<std::size_t>(cur.next);
    const Symbol right = symbols[next_pos];
    const auto m = merges.find(key(cur.id, right.id));
    if (m == merges.end() || m->second.id != top.id) continue;  // stale
    cur.id = top.id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = static_cast<std::int64_t>(top.pos);
    if (cur.prev >= 0) {
      const auto p = merges.find(key(symbols[static_cast<std::size_t>(cur.prev)].id, cur.id));
      if (p != merges.end()) queue.push({p->second.rank, static_cast<std::size_t>(cur.prev), p->second.id});
    }
    if (cur.next >= 0) {
      const auto n = merges.find(key(cur.id, symbols[static_cast<std::size_t>(cur.next)].id));
      if (n != merges.end()) queue.push({n->second.rank, top.pos, n->second.id});
    }
  }
  for (const auto& sym : symbols) {
    if (sym.len > 0) out.push_back(sym.id);
  }
}

}  // namespace trainer::text::detail
