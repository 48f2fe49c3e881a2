// A SentencePiece model (spiece.model, spm.model) with the tokenizer_config.json transformers
// writes beside it, tokenized as transformers' Python tokenizer of that class does (T5Tokenizer,
// AlbertTokenizer, DebertaV2Tokenizer of transformers 4.39): its added tokens split out first,
// its lower-casing, its class's preprocessing, the pieces of Debian's libsentencepiece, and the
// class's special tokens around the text (sentencepiece_config.cpp reads the file).
#include "text/sentencepiece_tokenizer.h"

#include "text/unicode.h"
#include "trainer/error.h"

namespace trainer::text::detail {

namespace {

/// SentencePiece's word-start mark (U+2581), in UTF-8.
constexpr std::string_view kWordStart = "\xE2\x96\x81";

/// Python's s.lstrip() / s.rstrip(): without the whitespace str.isspace() names.
std::string strip_python_space(const std::string& s, bool left, bool right) {
  std::u32string u = decode_utf8(s);
  std::size_t a = 0, b = u.size();
  while (left && a < b && is_python_space(u[a])) ++a;
  while (right && b > a && is_python_space(u[b - 1])) --b;
  return encode_utf8(std::u32string_view(u).substr(a, b - a));
}

}  // namespace

const SentencePieceAdded* SentencePieceTokenizer::match(const std::string& s, std::size_t at) const {
  const Added* best = nullptr;
  added_trie.matches(s, at, [&](std::int32_t i, std::size_t) { best = &added[static_cast<std::size_t>(i)]; });
  return best;
}

std::string SentencePieceTokenizer::lower_outside_tokens(const std::string& s) const {
  std::string out;
  std::size_t i = 0;
  while (i < s.size()) {
    std::int32_t first = -1;
    std::size_t length = 0;
    kept_case.matches(s, i, [&](std::int32_t index, std::size_t len) {
      if (first < 0 || index < first) first = index, length = len;
    });
    if (first >= 0) {
      out.append(s, i, length);
      i += length;
      continue;
    }
    const auto b = static_cast<unsigned char>(s[i]);
    const std::size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    out += encode_utf8(lowercase(decode_utf8(std::string_view(s).substr(i, len))));
    i += len;
  }
  return out;
}

std::vector<std::string> SentencePieceTokenizer::encode_pieces(const std::string& s) const {
  std::vector<std::string> pieces;
  const auto emit = [](void* to, const char* piece, std::size_t size) {
    static_cast<std::vector<std::string>*>(to)->emplace_back(piece, size);
  };
  const char* error = sp->encode(s, emit, &pieces);
  TRAINER_CHECK_T(UsageError, error == nullptr, name, ": SentencePiece could not encode a text: ", error);
  return pieces;
}

void SentencePieceTokenizer::pieces_of(std::string s, std::vector<std::string>& out) const {
  if (kind == Kind::kT5) {
    const auto p = encode_pieces(s);
    out.insert(out.end(), p.begin(), p.end());
    return;
  }
  if (kind == Kind::kDebertaV2) {
    if (do_lower_case) s = encode_utf8(lowercase(decode_utf8(s)));
    const auto p = encode_pieces(s);
    out.insert(out.end(), p.begin(), p.end());
    return;
  }
  // AlbertTokenizer.preprocess_text, then the split of a piece ending in a digit and a comma.
  std::u32string u = decode_utf8(s);
  if (remove_space) {  // " ".join(text.strip().split())
    std::u32string joined;
    std::size_t i = 0;
    while (i < u.size()) {
      while (i < u.size() && is_python_space(u[i])) ++i;
      const std::size_t start = i;
      while (i < u.size() && !is_python_space(u[i])) ++i;
      if (i > start) {
        if (!joined.empty()) joined += U' ';
        joined.append(u, start, i - start);
      }
    }
    u = std::move(joined);
  }
  std::u32string quoted;  // `` and '' become "
  for (std::size_t i = 0; i < u.size(); ++i) {
    if (i + 1 < u.size() && ((u[i] == U'`' && u[i + 1] == U'`') || (u[i] == U'\'' && u[i + 1] == U'\''))) {
      quoted += U'"';
      ++i;
    } else {
      quoted += u[i];
    }
  }
  u = std::move(quoted);
  if (!keep_accents) u = nfkd_without_marks(u);
  if (do_lower_case) u = lowercase(u);
  for (const auto& piece : encode_pieces(encode_utf8(u))) {
    const std::u32string p = decode_utf8(piece);
    if (p.size() > 1 && p.back() == U',' && is_python_digit(p[p.size() - 2])) {
      std::string bare = encode_utf8(std::u32string_view(p).substr(0, p.size() - 1));
      for (std::size_t at; (at = bare.find(kWordStart)) != std::string::npos;) bare.erase(at, kWordStart.size());
      auto cur = encode_pieces(bare);
      const bool starts = piece.compare(0, kWordStart.size(), kWordStart) == 0;
      if (!starts && !cur.empty() && cur[0].compare(0, kWordStart.size(), kWordStart) == 0) {
        if (cur[0].size() == kWordStart.size()) {
          cur.erase(cur.begin());
        } else {
          cur[0].erase(0, kWordStart.size());
        }
      }
      out.insert(out.end(), cur.begin(), cur.end());
      out.emplace_back(",");
    } else {
      out.push_back(piece);
    }
  }
}

std::vector<std::int64_t> SentencePieceTokenizer::tokenize(std::string_view input) const {
  std::string s(input);
  if (do_lower_case) s = lower_outside_tokens(s);
  // The trie's split: text and added tokens in turn (an added token's chunk has its index).
  struct Chunk {
    std::string text;
    const Added* token = nullptr;
  };
  std::vector<Chunk> chunks;
  std::size_t from = 0;
  for (std::size_t at = 0; at < s.size();) {
    const Added* t = (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80 ? nullptr : match(s, at);
    if (t == nullptr) {
      ++at;
      continue;
    }
    if (at > from) chunks.push_back({s.substr(from, at - from), nullptr});
    chunks.push_back({t->content, t});
    at += t->content.size();
    from = at;
  }
  if (from < s.size()) chunks.push_back({s.substr(from), nullptr});
  // Each token strips or joins its neighbours as transformers does, in order.
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const Added* t = chunks[i].token;
    if (t == nullptr) continue;
    Chunk* left = i > 0 && !chunks[i - 1].text.empty() ? &chunks[i - 1] : nullptr;
    Chunk* right = i + 1 < chunks.size() && !chunks[i + 1].text.empty() ? &chunks[i + 1] : nullptr;
    // single_word looks at the neighbours as they were before this token stripped them.
    const char before = left != nullptr ? left->text.back() : ' ';
    const char after = right != nullptr ? right->text.front() : ' ';
    const auto restrip = [](Chunk& c, bool l, bool r) {
      std::string stripped = strip_python_space(c.text, l, r);
      if (stripped != c.text) c.token = nullptr;
      c.text = std::move(stripped);
    };
    if (t->rstrip && right != nullptr) restrip(*right, true, false);
    if (t->lstrip && left != nullptr) restrip(*left, false, true);
    if (t->single_word && left != nullptr && before != ' ') {
      left->text += chunks[i].text;
      left->token = nullptr;
      chunks[i] = {std::string(), nullptr};
    } else if (t->single_word && right != nullptr && after != ' ') {
      right->text = chunks[i].text + right->text;
      right->token = nullptr;
      chunks[i] = {std::string(), nullptr};
    }
  }
  std::vector<std::string> pieces;
  std::vector<std::int64_t> ids;
  for (const auto& c : chunks) {
    if (c.text.empty()) continue;
    if (c.token != nullptr) {
      ids.push_back(c.token->id);
      continue;
    }
    pieces.clear();
    pieces_of(c.text, pieces);
    for (const auto& p : pieces) {
      const auto a = added_ids.find(p);
      ids.push_back(a != added_ids.end() ? a->second : sp->piece_to_id(p));
    }
  }
  return ids;
}

std::optional<std::int64_t> SentencePieceTokenizer::vocab_id(const std::string& token) const {
  const int id = sp->piece_to_id(token);
  if (sp->is_unknown(id) && sp->id_to_piece(id) != token) return std::nullopt;
  return id;
}

}  // namespace trainer::text::detail
