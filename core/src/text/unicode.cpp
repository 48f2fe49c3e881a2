#include "text/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <iterator>

namespace trainer::text {
namespace {

struct CodePointRange {
  char32_t lo, hi;
};

#include "text/unicode_tables.inc"

template <std::size_t N>
bool in(const CodePointRange (&table)[N], char32_t c) {
  const auto* it = std::upper_bound(std::begin(table), std::end(table), c,
                                    [](char32_t v, const CodePointRange& r) { return v < r.lo; });
  return it != std::begin(table) && c <= std::prev(it)->hi;
}

bool in_table(CharClass cls, char32_t c) {
  switch (cls) {
    case CharClass::kCleanRemoved:
      return in(k_clean_removed, c);
    case CharClass::kCleanSpace:
      return in(k_clean_space, c);
    case CharClass::kBertPunctuation:
      return in(k_bert_punctuation, c);
    case CharClass::kBertWhitespace:
      return in(k_bert_whitespace, c);
    case CharClass::kNonspacingMark:
      return in(k_nonspacing_mark, c);
    case CharClass::kCombiningMark:
      return in(k_combining_mark, c);
    case CharClass::kPatternLetter:
      return in(k_pattern_letter, c);
    case CharClass::kPatternNumber:
      return in(k_pattern_number, c);
    case CharClass::kPatternSpace:
      return in(k_pattern_space, c);
    case CharClass::kWord:
      return in(k_word, c);
    case CharClass::kReorderedMark:
      return in(k_reordered_mark, c);
  }
  return false;
}

constexpr int kClasses = static_cast<int>(CharClass::kReorderedMark) + 1;

/// The classes of the ASCII characters, the common case, without a search.
struct AsciiClasses {
  bool of[kClasses][128];
  AsciiClasses() : of{} {
    for (int k = 0; k < kClasses; ++k) {
      for (char32_t c = 0; c < 128; ++c) of[k][c] = in_table(static_cast<CharClass>(k), c);
    }
  }
};

}  // namespace

bool in_class(CharClass cls, char32_t c) {
  static const AsciiClasses ascii;
  if (c < 128) return ascii.of[static_cast<int>(cls)][c];
  return in_table(cls, c);
}

std::size_t invalid_utf8_at(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    char32_t c = 0, min = 0;
    if ((b & 0xE0) == 0xC0) {
      len = 2, c = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, c = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, c = b & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (n - i < len) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      c = (c << 6) | (p[i + k] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
    } else if ((b & 0xE0) == 0xC0) {
      out.push_back(static_cast<char32_t>(((b & 0x1F) << 6) | (p[i + 1] & 0x3F)));
      i += 2;
    } else if ((b & 0xF0) == 0xE0) {
      out.push_back(static_cast<char32_t>(((b & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F)));
      i += 3;
    } else {
      out.push_back(static_cast<char32_t>(((b & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) |
                                          (p[i + 3] & 0x3F)));
      i += 4;
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char32_t c : s) append_utf8(out, c);
  return out;
}

std::u32string nfd(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (const char32_t c : s) {
    // Plain ASCII and U+11938 (whose decomposition tokenizers' tables predate) stay as they are.
    if (c < 0xC0 || c == 0x11938) {
      out.push_back(c);
      continue;
    }
    utf8proc_int32_t parts[8];
    int boundclass = 0;
    const utf8proc_ssize_t n =
        utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), parts, 8, UTF8PROC_DECOMPOSE, &boundclass);
    if (n < 1 || n > 8) {
      out.push_back(c);  // no canonical decomposition is longer than 4
      continue;
    }
    for (utf8proc_ssize_t k = 0; k < n; ++k) out.push_back(static_cast<char32_t>(parts[k]));
  }
  // Canonical order: within each run of characters with a non-zero combining class, a stable
  // sort by class.
  // The classes of the marks tokenizers' tables know (classes never change once assigned);
  // the others stay where they are, as there.
  const auto cls = [](char32_t c) {
    return c < 0x300 || !in_class(CharClass::kReorderedMark, c)
               ? 0
               : utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class;
  };
  for (std::size_t i = 0; i < out.size();) {
    if (cls(out[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < out.size() && cls(out[j]) != 0) ++j;
    std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(i), out.begin() + static_cast<std::ptrdiff_t>(j),
                     [&](char32_t a, char32_t b) { return cls(a) < cls(b); });
    i = j;
  }
  return out;
}

std::u32string lowercase(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (const char32_t c : s) {
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    } else if (c == 0x130) {
      // The one unconditional full mapping of two characters: İ to i and a combining dot.
      out.push_back(U'i');
      out.push_back(0x307);
    } else {
      out.push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

std::u32string nfkd_without_marks(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (const char32_t c : s) {
    if (c < 0x80) {
      out.push_back(c);
      continue;
    }
    utf8proc_int32_t parts[32];  // the longest compatibility decomposition is 18 (U+FDFA)
    int boundclass = 0;
    const utf8proc_ssize_t n =
        utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), parts, 32,
                                static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT), &boundclass);
    const auto keep = [&](utf8proc_int32_t p) {
      if (utf8proc_get_property(p)->combining_class == 0) out.push_back(static_cast<char32_t>(p));
    };
    if (n < 1 || n > 32) {
      keep(static_cast<utf8proc_int32_t>(c));
      continue;
    }
    for (utf8proc_ssize_t k = 0; k < n; ++k) keep(parts[k]);
  }
  return out;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_python_digit(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  if (utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND) return true;
  // Numeric_Type=Digit: the digits that are not decimal (superscripts, subscripts, circled and
  // parenthesized, Ethiopic, dingbats, ...).
  static constexpr char32_t kDigitRanges[][2] = {
      {0xB2, 0xB3},     {0xB9, 0xB9},       {0x1369, 0x1371},   {0x19DA, 0x19DA},   {0x2070, 0x2070},
      {0x2074, 0x2079}, {0x2080, 0x2089},   {0x2460, 0x2468},   {0x2474, 0x247C},   {0x2488, 0x2490},
      {0x24EA, 0x24EA}, {0x24F5, 0x24FD},   {0x24FF, 0x24FF},   {0x2776, 0x277E},   {0x2780, 0x2788},
      {0x278A, 0x2792}, {0x10A40, 0x10A43}, {0x10E60, 0x10E68}, {0x11052, 0x1105A}, {0x1F100, 0x1F10A}};
  for (const auto& r : kDigitRanges) {
    if (c >= r[0] && c <= r[1]) return true;
  }
  return false;
}

bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

}  // namespace trainer::text
