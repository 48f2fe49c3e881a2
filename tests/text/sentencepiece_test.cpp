// SentencePiece models with transformers' tokenizer_config.json (fixture hf_tokenizers:
// tests/text/hf_sentencepiece.py writes t5, albert and deberta): their special ids and limits
// come from the files, T5 closes a text once, a directory picks its SentencePiece model, and
// files it cannot read are refused naming the file, the key and what is allowed. The corpus
// comparison with transformers is tokenizer_test.cpp's HfCorpus.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <tuple>

#include "support/sentencepiece_skip.h"
#include "support/test_util.h"
#include "text/tokenizer.h"
#include "trainer/error.h"

namespace {

namespace fs = std::filesystem;
using trainer::testing::read_file;
using trainer::testing::TempDir;
using trainer::testing::write_file;
using trainer::text::Tokenizer;

const std::string kSpFixtures = TRAINER_HF_TOKENIZERS;

std::string spiece_error_of(const fs::path& path) {
  try {
    Tokenizer::from_path(path);
  } catch (const trainer::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SentencePiece, SpecialIdsAndLimitsComeFromTheFiles) {
  TRAINER_SKIP_WITHOUT_SENTENCEPIECE();
  const Tokenizer t5 = Tokenizer::from_path(kSpFixtures + "/t5");
  EXPECT_EQ(t5.model_type(), "SentencePiece");
  EXPECT_EQ(t5.file(), kSpFixtures + "/t5/spiece.model");
  EXPECT_EQ(t5.pad_id(), 0);
  EXPECT_EQ(t5.mask_id(), std::nullopt);         // T5 has sentinels, not a mask token
  EXPECT_EQ(t5.id_limit(), 4100);                // 4000 pieces and the 100 <extra_id_N>
  EXPECT_EQ(t5.token_id("<extra_id_0>"), 4099);  // counted down from the last, as T5Tokenizer
  EXPECT_EQ(t5.special_tokens_added(false), 1);  // text </s>
  EXPECT_EQ(t5.special_tokens_added(true), 2);   // a </s> b </s>
  EXPECT_EQ(t5.token_id("no such piece"), std::nullopt);

  const Tokenizer albert = Tokenizer::from_path(kSpFixtures + "/albert/spiece.model");  // the file itself
  EXPECT_EQ(albert.pad_id(), 0);
  EXPECT_EQ(albert.mask_id(), 4);  // [MASK], a control piece of the model
  EXPECT_EQ(albert.id_limit(), 4000);
  EXPECT_EQ(albert.special_tokens_added(true), 3);

  const Tokenizer deberta = Tokenizer::from_path(kSpFixtures + "/deberta");
  EXPECT_EQ(deberta.file(), kSpFixtures + "/deberta/spm.model");
  EXPECT_EQ(deberta.pad_id(), 0);
  EXPECT_EQ(deberta.mask_id(), 4000);  // added after the pieces, as DebertaV2Tokenizer does
  EXPECT_EQ(deberta.id_limit(), 4001);
  const auto e = deberta.encode("hello", std::string_view("world"));
  EXPECT_EQ(e.ids.front(), 1);  // [CLS]
  EXPECT_EQ(e.ids.back(), 2);   // [SEP]
  EXPECT_EQ(e.type_ids.back(), 1);
}

TEST(SentencePiece, T5ClosesATextOnceAndAlbertLowersOutsideItsSpecialTokens) {
  TRAINER_SKIP_WITHOUT_SENTENCEPIECE();
  const Tokenizer t5 = Tokenizer::from_path(kSpFixtures + "/t5");
  const auto plain = t5.encode("hello world");
  const auto closed = t5.encode("hello world</s>");
  EXPECT_EQ(plain.ids, closed.ids);  // no second </s>
  EXPECT_EQ(closed.ids.back(), 1);
  EXPECT_EQ(closed.special_mask.back(), 0);  // the text's own </s>, not one the template added
  EXPECT_EQ(t5.encode("a <extra_id_0> b").ids[1 + t5.encode("a").ids.size() - 2], 4099);

  const Tokenizer albert = Tokenizer::from_path(kSpFixtures + "/albert");
  EXPECT_EQ(albert.encode("HELLO World").ids, albert.encode("hello world").ids);
  EXPECT_EQ(albert.encode("Café").ids, albert.encode("cafe").ids);  // accents removed
  const auto masked = albert.encode("hello [MASK] world").ids;
  EXPECT_NE(std::find(masked.begin(), masked.end(), 4), masked.end());
  const auto lowered = albert.encode("hello [mask] world").ids;  // not the token: lower case pieces
  EXPECT_EQ(std::find(lowered.begin(), lowered.end(), 4), lowered.end());
}

class SentencePieceFiles : public ::testing::Test {
 protected:
  /// A copy of the albert directory with tokenizer_config.json changed by `edit`.
  fs::path with_config(const std::function<void(nlohmann::json&)>& edit) {
    fs::create_directories(tmp_ / "albert");
    fs::copy_file(kSpFixtures + "/albert/spiece.model", tmp_ / "albert/spiece.model",
                  fs::copy_options::overwrite_existing);
    auto config = nlohmann::json::parse(read_file(kSpFixtures + "/albert/tokenizer_config.json"));
    edit(config);
    write_file(tmp_ / "albert/tokenizer_config.json", config.dump());
    return tmp_ / "albert";
  }
  TempDir tmp_;
};

TEST_F(SentencePieceFiles, FilesItCannotReadAreRefusedNamingTheKeyAndWhatIsAllowed) {
  TRAINER_SKIP_WITHOUT_SENTENCEPIECE();
  const std::string config = tmp_ / "albert/tokenizer_config.json";
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& c) { c["tokenizer_class"] = "XLNetTokenizer"; },
       ": tokenizer_class: \"XLNetTokenizer\" is not a SentencePiece tokenizer read here; allowed: T5Tokenizer, "
       "AlbertTokenizer, DebertaV2Tokenizer"},
      {[](auto& c) { c.erase("tokenizer_class"); }, ": tokenizer_class: missing is not a SentencePiece tokenizer"},
      {[](auto& c) { c.erase("added_tokens_decoder"); },
       ": added_tokens_decoder: missing: transformers before 4.34 did not write it"},
      {[](auto& c) { c["added_tokens_decoder"]["x"] = c["added_tokens_decoder"]["0"]; },
       ": added_tokens_decoder.x: expected an id from 0 to the vocabulary's size (4000)"},
      {[](auto& c) {
         c["added_tokens_decoder"]["9100"] = {{"content", "<far>"}};
       },
       ": added token ids run up to 9100 for a model of 4000 pieces"},
      {[](auto& c) { c["added_tokens_decoder"]["0"]["lstrip"] = "yes"; },
       ": added_tokens_decoder.0.lstrip: expected true or false, not \"yes\""},
      {[](auto& c) { c["pad_token"] = "<nothing>"; },
       ": pad_token: \"<nothing>\" is neither an added token nor a piece of spiece.model"},
      {[](auto& c) { c["cls_token"] = nullptr; }, ": cls_token: missing: AlbertTokenizer puts it around each text"},
      {[](auto& c) { c["do_lower_case"] = 1; }, ": do_lower_case: expected true or false, not 1"},
      {[](auto& c) { c["tokenizer_class"] = "T5Tokenizer", c["legacy"] = false, c["eos_token"] = "[SEP]"; },
       ": legacy: false is T5Tokenizer's newer handling of the text after a special token, not read here"},
      {[](auto& c) { c["tokenizer_class"] = "DebertaV2Tokenizer", c["split_by_punct"] = true; },
       ": split_by_punct: true is not read here"},
      {[](auto& c) { c["additional_special_tokens"] = {""}; },
       ": additional_special_tokens: expected tokens (non-empty strings), not \"\""},
      {[](auto& c) { c["additional_special_tokens"] = {"<not a piece>"}; },
       ": additional_special_tokens: \"<not a piece>\" is neither an added token nor a piece of spiece.model"},
      {[](auto& c) {
         std::vector<std::string> many;
         for (int i = 0; i < 100'001; ++i) many.push_back("[" + std::to_string(i) + "]");
         c["additional_special_tokens"] = many;
       },
       ": more special tokens than are read here (100000 tokens"},
      {[](auto& c) { c["split_special_tokens"] = true; }, ": split_special_tokens: true (special tokens tokenized"},
      {[](auto& c) { c["truncation_side"] = "left"; }, ": truncation_side: only \"right\""},
      {[](auto& c) {
         c["sp_model_kwargs"] = {{"enable_sampling", true}};
       },
       ": sp_model_kwargs: options of the SentencePiece processor"},
  };
  for (const auto& c : cases) {
    const std::string msg = spiece_error_of(with_config(c.edit));
    EXPECT_NE(msg.find(config + c.message), std::string::npos) << msg << "\n  expected " << c.message;
  }
  // The model itself: not a protocol buffer of a model, or cut short.
  with_config([](nlohmann::json&) {});
  write_file(tmp_ / "albert/spiece.model", "not a model at all");
  EXPECT_NE(spiece_error_of(tmp_ / "albert").find("albert/spiece.model: not a SentencePiece model ("),
            std::string::npos)
      << spiece_error_of(tmp_ / "albert");
  const std::string model = read_file(kSpFixtures + "/albert/spiece.model");
  write_file(tmp_ / "albert/spiece.model", model.substr(0, model.size() / 2));
  EXPECT_NE(spiece_error_of(tmp_ / "albert").find("albert/spiece.model: not a SentencePiece model ("),
            std::string::npos);
  // Without tokenizer_config.json, or with one that is not JSON.
  fs::remove(config);
  EXPECT_NE(spiece_error_of(tmp_ / "albert")
                .find("spiece.model: no tokenizer_config.json beside it, which names the "
                      "tokenizer's class"),
            std::string::npos)
      << spiece_error_of(tmp_ / "albert");
  write_file(config, "{\"tokenizer_class\": ");
  EXPECT_NE(spiece_error_of(tmp_ / "albert").find(config + ": not a tokenizer_config.json"), std::string::npos);
  // A path that holds no tokenizer.
  EXPECT_NE(spiece_error_of(tmp_ / "nowhere").find("nowhere: no such file (a tokenizer.json, a SentencePiece .model"),
            std::string::npos);
  fs::create_directories(tmp_ / "empty");
  EXPECT_NE(spiece_error_of(tmp_ / "empty").find("empty: a directory without a tokenizer"), std::string::npos);
}

/// A protocol buffer varint.
std::string varint(std::uint64_t n) {
  std::string out;
  do {
    out += static_cast<char>((n & 0x7F) | (n > 0x7F ? 0x80 : 0));
    n >>= 7;
  } while (n != 0);
  return out;
}

/// `model` (a serialized ModelProto) with its normalizer's precompiled character map replaced.
std::string with_charsmap(const std::string& model, const std::string& charsmap) {
  const auto read_varint = [](const std::string& b, std::size_t& at) {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto c = static_cast<unsigned char>(b.at(at++));
      v |= std::uint64_t{c & 0x7Fu} << shift;
      if (c < 0x80) return v;
    }
  };
  // Each field of `b` as (number, wire type, its bytes whole, its payload when length-delimited).
  const auto fields = [&](const std::string& b) {
    std::vector<std::tuple<std::uint64_t, std::string, std::string>> out;
    for (std::size_t at = 0; at < b.size();) {
      const std::size_t start = at;
      const std::uint64_t key = read_varint(b, at);
      std::string payload;
      if ((key & 7) == 0) {
        read_varint(b, at);
      } else if ((key & 7) == 2) {
        const auto n = static_cast<std::size_t>(read_varint(b, at));
        payload = b.substr(at, n);
        at += n;
      } else {
        at += (key & 7) == 5 ? 4 : 8;
      }
      out.emplace_back(key >> 3, b.substr(start, at - start), payload);
    }
    return out;
  };
  std::string out;
  for (const auto& [number, whole, payload] : fields(model)) {
    if (number != 3) {
      out += whole;
      continue;
    }
    std::string spec;
    for (const auto& [n2, whole2, payload2] : fields(payload)) {
      spec += n2 == 2 ? "\x12" + varint(charsmap.size()) + charsmap : whole2;
    }
    out += "\x1a" + varint(spec.size()) + spec;
  }
  return out;
}

std::string u32(std::uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

// What a review found, each against transformers' Python tokenizer (run on these inputs).
TEST_F(SentencePieceFiles, TokensBesideTokensRolesAndTruncationAsTransformersDoes) {
  TRAINER_SKIP_WITHOUT_SENTENCEPIECE();
  // A token with lstrip and single_word: "abc <L>" is text and then the token (Python:
  // ['▁ab', 'c', '<L>']): single_word looks at the text before lstrip removed its space.
  // (do_lower_case off: lower-casing would make "<L>", a special token no role names, "<l>" first.)
  const auto dir = with_config([](nlohmann::json& c) {
    c["do_lower_case"] = false;
    c["added_tokens_decoder"]["4000"] = {{"content", "<L>"},    {"lstrip", true},  {"rstrip", false},
                                         {"single_word", true}, {"special", true}, {"normalized", false}};
  });
  const Tokenizer albert = Tokenizer::from_path(dir);
  auto ids = albert.encode("abc <L>").ids;
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[ids.size() - 2], 4000);
  auto text = albert.encode("abc").ids;
  text.pop_back();
  EXPECT_EQ(std::vector<std::int64_t>(ids.begin(), ids.end() - 2), text);
  EXPECT_EQ(albert.encode("   <L>").ids, (std::vector<std::int64_t>{2, 4000, 3}));  // stripped to nothing
  // [MASK] named by mask_token but missing from added_tokens_decoder is still split out.
  const Tokenizer no_mask =
      Tokenizer::from_path(with_config([](nlohmann::json& c) { c["added_tokens_decoder"].erase("4"); }));
  const auto masked = no_mask.encode("hello [MASK] world").ids;
  EXPECT_NE(std::find(masked.begin(), masked.end(), 4), masked.end());
  EXPECT_EQ(no_mask.mask_id(), 4);
  // A single text at a max_length of just the special tokens stays uncut, as in Python.
  EXPECT_EQ(albert.encode("hello world", std::nullopt, 2).ids, albert.encode("hello world").ids);
  EXPECT_EQ(albert.encode("hello world", std::string_view("again"), 3).ids, (std::vector<std::int64_t>{2, 3, 3}));
  // T5Tokenizer has no do_lower_case: the key changes nothing there.
  fs::create_directories(tmp_ / "t5");
  fs::copy_file(kSpFixtures + "/t5/spiece.model", tmp_ / "t5/spiece.model");
  auto t5_config = nlohmann::json::parse(read_file(kSpFixtures + "/t5/tokenizer_config.json"));
  t5_config["do_lower_case"] = true;
  write_file(tmp_ / "t5/tokenizer_config.json", t5_config.dump());
  EXPECT_EQ(Tokenizer::from_path(tmp_ / "t5").encode("Hello WORLD").ids,
            Tokenizer::from_path(kSpFixtures + "/t5").encode("Hello WORLD").ids);
}

// A model whose character map sends libsentencepiece's trie walk outside the map (it reads
// without bounds checks and crashes on the first text) is refused when it is read.
TEST_F(SentencePieceFiles, ACharacterMapThatWouldReadOutsideItselfIsRefused) {
  TRAINER_SKIP_WITHOUT_SENTENCEPIECE();
  with_config([](nlohmann::json&) {});
  const std::string model = read_file(kSpFixtures + "/albert/spiece.model");
  const std::string far_root = u32(4) + u32((0x3FFFFFu << 10) | (1u << 9)) + std::string("x\0", 2);
  // 256 units: "a" (0x61) is a leaf whose value unit (0x62) points at byte 5000 of 2 bytes of strings.
  std::string units;
  for (std::uint32_t i = 0; i < 256; ++i) {
    units += u32(i == 0x61 ? (3u << 10) | (1u << 8) | 0x61 : i == 0x62 ? 5000u : 0u);
  }
  const std::string past_strings = u32(1024) + units + std::string("x\0", 2);
  for (const auto& charsmap : {far_root, past_strings, u32(4000) + "xy"}) {
    write_file(tmp_ / "albert/spiece.model", with_charsmap(model, charsmap));
    EXPECT_NE(spiece_error_of(tmp_ / "albert")
                  .find("spiece.model: not a SentencePiece model that can be read safely (a "
                        "character map"),
              std::string::npos)
        << spiece_error_of(tmp_ / "albert");
  }
  write_file(tmp_ / "albert/spiece.model", with_charsmap(model, ""));  // none: the identity
  EXPECT_EQ(Tokenizer::from_path(tmp_ / "albert").encode("abc").ids.front(), 2);
}

}  // namespace
