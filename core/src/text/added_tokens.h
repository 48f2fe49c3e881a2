#pragma once
// A tokenizer.json's added tokens and how tokenizers splits a text at them (before and after
// the normalizer). Internal to text/tokenizer_json.cpp.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "text/byte_trie.h"

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

/// Added tokens, matched as tokenizers matches them: the leftmost match, the longest there, the
/// first listed among equals (leftmost-longest). A text is read twice, each time once: from its
/// end through an automaton of the tokens written backwards, which finds the longest token that
/// starts at each byte, then from its start, taking the leftmost. The work is linear in the text
/// whatever the tokens (how many, how long, how many lengths).
class AddedTokens {
 public:
  /// Adds `t`; of two with the same content, the first added is matched. Call finish() after the last.
  void add(AddedToken t) {
    reversed_.add(std::string(t.content.rbegin(), t.content.rend()), static_cast<std::int32_t>(tokens_.size()));
    tokens_.push_back(std::move(t));
  }
  /// Builds the automaton: after the last add(), before split().
  void finish() { reversed_.link(); }
  bool empty() const { return tokens_.empty(); }

  /// Splits `s` at these tokens as tokenizers does, appending to `out`: the leftmost match, the
  /// longest there, then on after it; single_word, lstrip and rstrip as the token says. Returns
  /// the automaton's edge lookups, the measure of its work: at most two per byte of `s`.
  std::size_t split(const std::string& s, std::vector<Segment>& out) const;

 private:
  /// Per byte of `s`: the index of the longest token that starts there, or -1. Adds the edge
  /// lookups it made to `lookups`.
  std::vector<std::int32_t> longest_starts(const std::string& s, std::size_t& lookups) const;

  std::vector<AddedToken> tokens_;
  ByteTrie reversed_;  ///< each token's content written backwards, by its index
};

}  // namespace trainer::text::detail
