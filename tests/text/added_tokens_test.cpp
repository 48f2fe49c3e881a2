// AddedTokens: tokenizers' leftmost-longest matching of a tokenizer.json's added tokens, against
// a reference that tries every token at every position, and the work it does counted: the
// automaton's edge lookups, linear in the text whatever the tokens.
#include "text/added_tokens.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace {

using trainer::text::detail::AddedToken;
using trainer::text::detail::AddedTokens;
using trainer::text::detail::Segment;

constexpr std::int64_t kFirstId = 100;  ///< token i has the id kFirstId + i

AddedTokens tokens_of(const std::vector<std::string>& contents) {
  AddedTokens t;
  for (std::size_t i = 0; i < contents.size(); ++i) {
    AddedToken a;
    a.content = contents[i];
    a.id = kFirstId + static_cast<std::int64_t>(i);
    t.add(a);
  }
  t.finish();
  return t;
}

/// The split of `s` by a reference: from the left, at each position every token tried; at the
/// first position where one matches, the longest (the first listed among equals), then on
/// after it.
std::vector<Segment> reference_split(const std::vector<std::string>& contents, const std::string& s) {
  std::vector<Segment> out;
  std::size_t done = 0;
  for (std::size_t at = 0; at < s.size();) {
    std::int64_t best = -1;
    for (std::size_t i = 0; i < contents.size(); ++i) {
      const bool longer = best < 0 || contents[i].size() > contents[static_cast<std::size_t>(best)].size();
      if (s.compare(at, contents[i].size(), contents[i]) == 0 && longer) best = static_cast<std::int64_t>(i);
    }
    if (best < 0) {
      ++at;
      continue;
    }
    if (done < at) out.push_back({s.substr(done, at - done), -1});
    out.push_back({std::string(), kFirstId + best});
    at = done = at + contents[static_cast<std::size_t>(best)].size();
  }
  if (done < s.size() || s.empty()) out.push_back({s.substr(done), -1});
  return out;
}

std::vector<Segment> split(const AddedTokens& t, const std::string& s) {
  std::vector<Segment> out;
  t.split(s, out);
  return out;
}

::testing::AssertionResult same(const std::vector<Segment>& got, const std::vector<Segment>& want) {
  const auto show = [](const std::vector<Segment>& v) {
    std::string o;
    for (const auto& seg : v) o += seg.id >= 0 ? "<" + std::to_string(seg.id) + ">" : "'" + seg.text + "'";
    return o;
  };
  bool equal = got.size() == want.size();
  for (std::size_t i = 0; equal && i < got.size(); ++i) equal = got[i].text == want[i].text && got[i].id == want[i].id;
  if (equal) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << show(got) << ", want " << show(want);
}

TEST(AddedTokens, TheLeftmostMatchWinsThenTheLongestThere) {
  // tokenizers' own example: "b" is seen first, "abcd" starts first.
  EXPECT_TRUE(same(split(tokens_of({"abcd", "b"}), "abcdef"), {{"", 100}, {"ef", -1}}));
  EXPECT_TRUE(same(split(tokens_of({"ab", "abc", "bcd"}), "xabcd"), {{"x", -1}, {"", 101}, {"d", -1}}));
  // The first listed of two with the same content.
  EXPECT_TRUE(same(split(tokens_of({"zz", "zz"}), "zzz"), {{"", 100}, {"z", -1}}));
  EXPECT_TRUE(same(split(tokens_of({"[X]"}), ""), {{"", -1}}));
}

TEST(AddedTokens, SplitsAsAReferenceTryingEveryTokenAtEveryPosition) {
  std::mt19937 rng(61);
  const auto word = [&](std::size_t longest) {
    std::string w(1 + rng() % longest, 'a');
    for (auto& c : w) c = "abc"[rng() % 3];
    return w;
  };
  for (int round = 0; round < 500; ++round) {
    std::vector<std::string> contents(1 + rng() % 8);
    for (auto& c : contents) c = word(6);
    const std::string text = word(40);
    ASSERT_TRUE(same(split(tokens_of(contents), text), reference_split(contents, text)))
        << "round " << round << ", text '" << text << "'";
  }
}

// 3,000 tokens of 3,000 lengths: a text costs at most two edge lookups per byte, where looking
// each length up at each position cost 3,000 (the text's bytes times the tokens' lengths).
TEST(AddedTokens, TheWorkIsLinearInTheTextWhateverTheTokensLengths) {
  std::vector<std::string> tags, runs_after, runs_before;
  for (std::size_t k = 1; k <= 3000; ++k) {
    tags.push_back("<" + std::string(k, 'x') + ">");
    runs_after.push_back("b" + std::string(k, 'a'));   // the text's "aaa..." is each one's tail
    runs_before.push_back(std::string(k, 'a') + "b");  // and each one's head
  }
  std::string prose;
  while (prose.size() < 20000) prose += "a line of text with <xxx> and <x> in it, ";
  const std::string as = "b" + std::string(20000, 'a');
  struct Case {
    const std::vector<std::string>& contents;
    const std::string& text;
  };
  for (const Case& c : {Case{tags, prose}, Case{runs_after, as}, Case{runs_before, as}}) {
    const AddedTokens t = tokens_of(c.contents);
    std::vector<Segment> out;
    const std::size_t lookups = t.split(c.text, out);
    EXPECT_LE(lookups, 2 * c.text.size()) << c.contents.front();
    EXPECT_GE(lookups, c.text.size());
  }
  // The longest "b" + "a"... there is: 3,000 a's, then the rest of the text.
  EXPECT_TRUE(same(split(tokens_of(runs_after), as), {{"", kFirstId + 2999}, {std::string(17000, 'a'), -1}}));
}

}  // namespace
