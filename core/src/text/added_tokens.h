#pragma once
// A tokenizer.json's added tokens and how tokenizers splits a text at them (before and after
// the normalizer). Internal to text/tokenizer_json.cpp.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace trainer::text::detail {

struct AddedToken {
  std::string content;  ///< as matched: the content, or for a normalized token, its normalized form
  std::int64_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false;
};

/// Where a piece of the input stands: text still to tokenize, or an added token's id.
struct Segment {
  std::string text;
  std::int64_t id = -1;
};

/// Added tokens by content, looked up by each length they have: the leftmost match, the longest
/// there, the first listed among equals (tokenizers' leftmost-longest matching), in time linear
/// in the text for each distinct length, whatever the number of tokens.
struct AddedTokens {
  std::vector<AddedToken> tokens;
  std::map<std::size_t, std::unordered_map<std::string, std::size_t>, std::greater<>> by_length;

  void add(AddedToken t) {
    by_length[t.content.size()].emplace(t.content, tokens.size());
    tokens.push_back(std::move(t));
  }
  bool empty() const { return tokens.empty(); }
  /// The token matching `s` at `at`, longest first; nullptr when none does.
  const AddedToken* match(const std::string& s, std::size_t at) const;
  /// Splits `s` at these tokens as tokenizers does, appending to `out`: the leftmost match, the
  /// longest there, then on after it; single_word, lstrip and rstrip as the token says.
  void split(const std::string& s, std::vector<Segment>& out) const;
};

}  // namespace trainer::text::detail
