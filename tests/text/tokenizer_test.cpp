// Tokenizers read from tokenizer.json give the ids, type ids and special-token marks that
// Hugging Face's tokenizers and transformers give, line for line on a real corpus (fixture
// hf_tokenizers: tests/text/hf_tokenizers.py); files they cannot read are refused naming the
// key and what is allowed.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "support/sentencepiece_skip.h"
#include "support/test_util.h"
#include "text/unicode.h"
#include "trainer/error.h"

namespace {

using trainer::testing::read_file;
using trainer::testing::TempDir;
using trainer::text::Encoding;
using trainer::text::Tokenizer;

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::string all = read_file(path), line;
  std::size_t start = 0;
  for (std::size_t end; (end = all.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(all.substr(start, end - start));
  }
  return lines;
}

std::string join(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

std::string row(const Encoding& e) {
  std::vector<std::int64_t> special(e.special_mask.begin(), e.special_mask.end());
  return join(e.ids) + "|" + join(e.type_ids) + "|" + join(special);
}

const std::string kFixtures = TRAINER_HF_TOKENIZERS;

class HfCorpus : public ::testing::TestWithParam<std::string> {};

TEST_P(HfCorpus, EveryLineEncodesAsHuggingFaceEncodesIt) {
  if (GetParam() == "t5" || GetParam() == "albert" || GetParam() == "deberta") {
    TRAINER_SKIP_WITHOUT_SENTENCEPIECE();
  }
  const auto corpus = lines_of(kFixtures + "/corpus.txt");
  ASSERT_GE(corpus.size(), 10000u);  // the script refuses fewer real lines
  // The directory as save_pretrained wrote it: tokenizer.json, or a SentencePiece model with
  // tokenizer_config.json.
  const Tokenizer tok = Tokenizer::from_path(kFixtures + "/" + GetParam());
  for (const int max_length : {0, 24}) {
    const auto expected = lines_of(kFixtures + "/" + GetParam() + "/expected-" + std::to_string(max_length) + ".txt");
    ASSERT_EQ(expected.size(), corpus.size());
    int wrong = 0;
    for (std::size_t i = 0; i < corpus.size(); ++i) {
      std::optional<std::string_view> pair;
      if (i % 3 == 0 && i + 1 < corpus.size()) pair = corpus[i + 1];
      std::string got = row(tok.encode(corpus[i], pair, max_length));
      // "ids|-|-": T5Tokenizer's type ids and mask are one longer than its ids on this line
      // (hf_sentencepiece.py says why); the ids are compared.
      const auto bar = expected[i].find('|');
      if (expected[i].compare(bar, std::string::npos, "|-|-") == 0) got = got.substr(0, got.find('|')) + "|-|-";
      if (got != expected[i] && ++wrong <= 5) {
        ADD_FAILURE() << GetParam() << " max_length " << max_length << " line " << i << ": " << corpus[i]
                      << "\n  got      " << got << "\n  expected " << expected[i];
      }
    }
    EXPECT_EQ(wrong, 0) << GetParam() << " max_length " << max_length << ": lines encoded otherwise, of "
                        << corpus.size();
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, HfCorpus,
                         ::testing::Values("bert_uncased", "bert_cased", "roberta", "gpt2_prefix", "t5", "albert",
                                           "deberta"));

TEST(Tokenizer, TheCharacterTablesAreThoseTheLibraryHas) {
  // scripts/unicode_tables.py reads the classes off tokenizers 0.15.2 again: the committed
  // tables are what it writes.
  TempDir tmp;
  const auto r = trainer::testing::run_command(std::string(TRAINER_HF_PYTHON) + " " + TRAINER_SOURCE_DIR +
                                               "/scripts/unicode_tables.py " + (tmp / "tables.inc"));
  ASSERT_EQ(r.code, 0) << r.text;
  EXPECT_TRUE(read_file(tmp / "tables.inc") ==
              read_file(std::string(TRAINER_SOURCE_DIR) + "/core/src/text/unicode_tables.inc"));
}

TEST(Tokenizer, SpecialIdsAndLimitsComeFromTheFile) {
  const Tokenizer bert = Tokenizer::from_file(kFixtures + "/bert_uncased/tokenizer.json");
  EXPECT_EQ(bert.model_type(), "WordPiece");
  EXPECT_EQ(bert.pad_id(), 0);
  EXPECT_EQ(bert.mask_id(), 4);
  EXPECT_EQ(bert.id_limit(), 4000);
  EXPECT_EQ(bert.special_tokens_added(false), 2);
  EXPECT_EQ(bert.special_tokens_added(true), 3);
  const Tokenizer roberta = Tokenizer::from_file(kFixtures + "/roberta/tokenizer.json");
  EXPECT_EQ(roberta.model_type(), "BPE");
  EXPECT_EQ(roberta.pad_id(), 1);
  EXPECT_EQ(roberta.mask_id(), 4);
  EXPECT_EQ(roberta.special_tokens_added(true), 4);
  // What a truncation cut is counted: "one two three four" is 4 tokens, 2 of them kept.
  const Encoding cut = roberta.encode("one two three four", std::nullopt, 4);
  EXPECT_EQ(cut.ids.size(), 4u);
  EXPECT_EQ(cut.truncated, roberta.encode("one two three four").ids.size() - 4);
  EXPECT_EQ(roberta.encode("one", std::nullopt, 40).truncated, 0);
  // Too short for the special tokens: said, not cut into them.
  try {
    roberta.encode("a text", std::string_view("a pair"), 3);
    FAIL() << "no error";
  } catch (const trainer::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("maximum length of 3 is less than the 4 special tokens"), std::string::npos)
        << e.what();
  }
  // Invalid UTF-8 is refused, with where it is.
  try {
    bert.encode("ok \xC3\x28 no");
    FAIL() << "no error";
  } catch (const trainer::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 (at byte 3)"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, TheIdLimitCoversEveryIdItCanGive) {
  // A post-processor's id beyond the vocabulary (found by the fuzzer): a model for this
  // tokenizer needs 84 rows.
  const Tokenizer t = Tokenizer::from_json(
      R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1}},
          "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 83], "cls": ["[CLS]", 2]},
          "added_tokens": [{"id": 40, "content": "[X]", "special": true}]})",
      "t");
  EXPECT_EQ(t.id_limit(), 84);
  // Without a pre-tokenizer the text before the added token is one word, "a"; the added token
  // gets the next id after the vocabulary's (tokenizers assigns it; the file's 40 is not read).
  EXPECT_EQ(t.encode("a[X]").ids, (std::vector<std::int64_t>{2, 1, 2, 83}));
}

std::string error_of(const std::string& text);

/// Ids of `text` by the tokenizer.json `json`.
std::vector<std::int64_t> ids_of(const std::string& json, const std::string& text) {
  return Tokenizer::from_json(json, "t").encode(text).ids;
}

TEST(Tokenizer, TheCornersAReviewFoundGiveTokenizersIds) {
  // Each expectation is what tokenizers 0.15.2 gives for the same file and text.
  // A merge listed twice: the later rank counts.
  EXPECT_EQ(ids_of(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4},
                                 "merges": ["a b", "b c", "a b"]}})",
                   "abc"),
            (std::vector<std::int64_t>{0, 4}));
  // A merge with a continuing-subword prefix makes the token without it.
  EXPECT_EQ(ids_of(R"({"model": {"type": "BPE", "vocab": {"a": 0, "##b": 1, "ab": 2}, "merges": ["a ##b"],
                                 "continuing_subword_prefix": "##"}})",
                   "ab"),
            (std::vector<std::int64_t>{2}));
  // Added tokens get the vocabulary's id, else the next free one, whatever the file says.
  EXPECT_EQ(ids_of(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "hello": 2}, "merges": []},
                       "added_tokens": [{"id": 7, "content": "hello"}, {"id": 9, "content": "zz"}]})",
                   "hellozz"),
            (std::vector<std::int64_t>{2, 3}));
  // Two added tokens normalized to the same text: the special one wins.
  EXPECT_EQ(ids_of(R"({"model": {"type": "BPE", "vocab": {"x": 0}, "merges": []}, "normalizer": {"type": "Lowercase"},
                       "added_tokens": [{"id": 1, "content": "HELLO", "special": false, "normalized": true},
                                        {"id": 2, "content": "hello", "special": true, "normalized": true}]})",
                   "hello"),
            (std::vector<std::int64_t>{2}));
  // single_word: a squared letter (U+1F130, a symbol that is Alphabetic) is a word character.
  const std::string single = R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0}},
      "added_tokens": [{"id": 1, "content": "zz", "single_word": true}]})";
  EXPECT_EQ(ids_of(single, "\xF0\x9F\x84\xB0zz"), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(ids_of(single, "-zz"), (std::vector<std::int64_t>{0, 1}));
  // A maximum length of just the special tokens gives them alone.
  const Tokenizer bert = Tokenizer::from_json(
      R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1}},
          "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]}})",
      "t");
  EXPECT_EQ(bert.encode("a", std::nullopt, 2).ids, (std::vector<std::int64_t>{2, 3}));
  // NFD leaves in place a mark the library's tables do not know (U+1DFA, Unicode 14), and
  // orders those it does.
  const std::string nfd = R"({"model": {"type": "WordPiece", "unk_token": "[UNK]",
      "vocab": {"[UNK]": 0, "a\u0301\u1dfa": 1, "a\u0316\u0301": 2}}, "normalizer": {"type": "NFD"}})";
  EXPECT_EQ(ids_of(nfd, "a\xCC\x81\xE1\xB7\xBA"), (std::vector<std::int64_t>{1}));
  EXPECT_EQ(ids_of(nfd, "a\xCC\x81\xCC\x96"), (std::vector<std::int64_t>{2}));
  // Ids far beyond the tokens would make a model of that many rows: refused.
  EXPECT_NE(error_of(R"({"model": {"type": "WordPiece", "unk_token": "x", "vocab": {"x": 2147483646}}})")
                .find("ids run up to 2147483646 for 1 tokens"),
            std::string::npos);
}

TEST(Tokenizer, Utf8IsCheckedAsPythonChecksIt) {
  using trainer::text::invalid_utf8_at;
  constexpr auto npos = std::string_view::npos;
  EXPECT_EQ(invalid_utf8_at("plain"), npos);
  EXPECT_EQ(invalid_utf8_at("caf\xC3\xA9 \xF0\x9F\x98\x80"), npos);
  EXPECT_EQ(invalid_utf8_at("a\xC0\xAF"), 1u);         // overlong '/'
  EXPECT_EQ(invalid_utf8_at("ab\xED\xA0\x80"), 2u);    // a surrogate
  EXPECT_EQ(invalid_utf8_at("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(invalid_utf8_at("abc\xE2\x82"), 3u);       // cut short
  EXPECT_EQ(invalid_utf8_at("x\x80"), 1u);             // a continuation byte alone
}

/// The error reading `text` as a tokenizer.json gives.
std::string error_of(const std::string& text) {
  try {
    Tokenizer::from_json(text, "dir/tokenizer.json");
  } catch (const trainer::UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Tokenizer, FilesItCannotReadAreRefusedNamingTheKeyAndWhatIsAllowed) {
  const std::string wp = R"("model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1}})";
  const auto has = [](const std::string& error, const std::string& part) {
    EXPECT_NE(error.find(part), std::string::npos) << error;
  };
  has(error_of("not json"), "dir/tokenizer.json: not a tokenizer.json: invalid JSON at byte 2");
  has(error_of("6e336"), "dir/tokenizer.json: not a tokenizer.json: ");  // out of range: the fuzzer's find
  has(error_of(R"({"model": {"type": "WordPiece", "unk_token": "a", "vocab": {"a": 0}}, "padding": 3})"),
      "padding: expected an object or null, not 3");
  has(error_of("{}"), "dir/tokenizer.json: the file: has no \"model\"");
  has(error_of(R"({"model": {"type": "Unigram", "vocab": []}})"),
      "model.type: \"Unigram\" is not a model this reader has; it has WordPiece (BERT) and BPE");
  has(error_of(R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"a": 1}}})"),
      "model.unk_token: \"[UNK]\" is not in model.vocab");
  has(error_of(R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": -1}}})"),
      "model.vocab[\"[UNK]\"]: expected a token id from 0 to 2^31 - 1, not -1");
  has(error_of("{" + wp + R"(, "normalizer": {"type": "Precompiled"}})"),
      "normalizer.type: \"Precompiled\" is not a normalizer this reader has; it has BertNormalizer");
  has(error_of("{" + wp + R"(, "pre_tokenizer": {"type": "Metaspace"}})"),
      "pre_tokenizer.type: \"Metaspace\" is not a pre-tokenizer this reader has");
  has(error_of(
          "{" + wp +
          R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[X]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {}}})"),
      "post_processor.single[0]: \"[X]\" is not in post_processor.special_tokens");
  has(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})"),
      "model.merges[0]: \"a\", \"b\" or their merge \"ab\" is not in model.vocab");
  has(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}})"),
      "model.merges[0]: \"a\" is not two tokens with a space between");
  has(error_of(R"({"model": {"type": "BPE", "dropout": 0.1, "vocab": {"a": 0}, "merges": []}})"),
      "model.dropout: BPE dropout draws merges at random");
  has(error_of(std::string(20, '[') + std::string(20, ']')), "JSON nested deeper than a tokenizer.json is");
  has(error_of("{" + wp + R"(, "added_tokens": [{"id": 5, "content": ""}]})"), "added_tokens[0].content: is empty");
  TempDir tmp;
  try {
    Tokenizer::from_file(tmp / "missing.json");
    FAIL() << "no error";
  } catch (const trainer::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.json: cannot read a tokenizer.json"), std::string::npos) << e.what();
  }
  // A tokenizer_config.json beside it that cuts texts at their start (transformers'
  // truncation_side = "left"): trainer cuts at the end, so it is refused; "right" reads.
  trainer::testing::write_file(tmp / "tokenizer.json", "{" + wp + "}");
  trainer::testing::write_file(tmp / "tokenizer_config.json", R"({"truncation_side": "right"})");
  EXPECT_EQ(Tokenizer::from_path(tmp.str()).id_limit(), 2);
  trainer::testing::write_file(tmp / "tokenizer_config.json", R"({"truncation_side": "left"})");
  try {
    Tokenizer::from_path(tmp.str());
    FAIL() << "no error";
  } catch (const trainer::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: truncation_side: only \"right\" (the default: a text "
                                         "is cut at its end) is read, not \"left\""),
              std::string::npos)
        << e.what();
  }
  // A tokenizer.json whose truncation direction is Left (transformers' default side then): refused
  // alone, read when a tokenizer_config.json beside it says right.
  const std::string left =
      "{" + wp + R"(, "truncation": {"direction": "Left", "max_length": 8, "strategy": "LongestFirst", "stride": 0}})";
  has(error_of(left),
      "dir/tokenizer.json: truncation.direction: \"Left\" (transformers then cuts a text at its start)");
  has(error_of("{" + wp + R"(, "truncation": {"direction": "Up"}})"),
      "truncation.direction: expected \"Right\" or \"Left\"");
  trainer::testing::write_file(tmp / "tokenizer.json", left);
  trainer::testing::write_file(tmp / "tokenizer_config.json", R"({"truncation_side": "right"})");
  EXPECT_EQ(Tokenizer::from_path(tmp.str()).id_limit(), 2);
}

TEST(Tokenizer, BpeMergesByRankThenFromTheLeft) {
  // "aaa": (a a) at 0 and at 1 have one rank; the leftmost merges first: "aa" "a".
  const Tokenizer t = Tokenizer::from_json(
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "aa": 1, "b": 2, "ab": 3, "aab": 4}, "merges": ["a a", "a b", "aa b"]}})",
      "t");
  EXPECT_EQ(t.encode("aaa").ids, (std::vector<std::int64_t>{1, 0}));
  // "aab": (a a) outranks (a b), then (aa b).
  EXPECT_EQ(t.encode("aab").ids, (std::vector<std::int64_t>{4}));
  // A character outside the vocabulary without an unknown token is dropped, as tokenizers drops
  // it: its neighbours then merge.
  EXPECT_EQ(t.encode("acb").ids, (std::vector<std::int64_t>{3}));
}

}  // namespace
