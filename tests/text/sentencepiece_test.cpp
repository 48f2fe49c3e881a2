// SentencePiece models with transformers' tokenizer_config.json (fixture hf_tokenizers:
// tests/text/hf_sentencepiece.py writes t5, albert and deberta): their special ids and limits
// come from the files, T5 closes a text once, a directory picks its SentencePiece model, and
// files it cannot read are refused naming the file, the key and what is allowed. The corpus
// comparison with transformers is tokenizer_test.cpp's HfCorpus.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/test_util.h"
#include "text/tokenizer.h"
#include "trainer/error.h"

namespace {

namespace fs = std::filesystem;
using trainer::testing::read_file;
using trainer::testing::TempDir;
using trainer::testing::write_file;
using trainer::text::Tokenizer;

const std::string kFixtures = TRAINER_HF_TOKENIZERS;

std::string error_of(const fs::path& path) {
  try {
    Tokenizer::from_path(path);
  } catch (const trainer::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SentencePiece, SpecialIdsAndLimitsComeFromTheFiles) {
  const Tokenizer t5 = Tokenizer::from_path(kFixtures + "/t5");
  EXPECT_EQ(t5.model_type(), "SentencePiece");
  EXPECT_EQ(t5.file(), kFixtures + "/t5/spiece.model");
  EXPECT_EQ(t5.pad_id(), 0);
  EXPECT_EQ(t5.mask_id(), std::nullopt);         // T5 has sentinels, not a mask token
  EXPECT_EQ(t5.id_limit(), 4100);                // 4000 pieces and the 100 <extra_id_N>
  EXPECT_EQ(t5.token_id("<extra_id_0>"), 4099);  // counted down from the last, as T5Tokenizer
  EXPECT_EQ(t5.special_tokens_added(false), 1);  // text </s>
  EXPECT_EQ(t5.special_tokens_added(true), 2);   // a </s> b </s>
  EXPECT_EQ(t5.token_id("no such piece"), std::nullopt);

  const Tokenizer albert = Tokenizer::from_path(kFixtures + "/albert/spiece.model");  // the file itself
  EXPECT_EQ(albert.pad_id(), 0);
  EXPECT_EQ(albert.mask_id(), 4);  // [MASK], a control piece of the model
  EXPECT_EQ(albert.id_limit(), 4000);
  EXPECT_EQ(albert.special_tokens_added(true), 3);

  const Tokenizer deberta = Tokenizer::from_path(kFixtures + "/deberta");
  EXPECT_EQ(deberta.file(), kFixtures + "/deberta/spm.model");
  EXPECT_EQ(deberta.pad_id(), 0);
  EXPECT_EQ(deberta.mask_id(), 4000);  // added after the pieces, as DebertaV2Tokenizer does
  EXPECT_EQ(deberta.id_limit(), 4001);
  const auto e = deberta.encode("hello", std::string_view("world"));
  EXPECT_EQ(e.ids.front(), 1);  // [CLS]
  EXPECT_EQ(e.ids.back(), 2);   // [SEP]
  EXPECT_EQ(e.type_ids.back(), 1);
}

TEST(SentencePiece, T5ClosesATextOnceAndAlbertLowersOutsideItsSpecialTokens) {
  const Tokenizer t5 = Tokenizer::from_path(kFixtures + "/t5");
  const auto plain = t5.encode("hello world");
  const auto closed = t5.encode("hello world</s>");
  EXPECT_EQ(plain.ids, closed.ids);  // no second </s>
  EXPECT_EQ(closed.ids.back(), 1);
  EXPECT_EQ(closed.special_mask.back(), 0);  // the text's own </s>, not one the template added
  EXPECT_EQ(t5.encode("a <extra_id_0> b").ids[1 + t5.encode("a").ids.size() - 2], 4099);

  const Tokenizer albert = Tokenizer::from_path(kFixtures + "/albert");
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
    fs::copy_file(kFixtures + "/albert/spiece.model", tmp_ / "albert/spiece.model",
                  fs::copy_options::overwrite_existing);
    auto config = nlohmann::json::parse(read_file(kFixtures + "/albert/tokenizer_config.json"));
    edit(config);
    write_file(tmp_ / "albert/tokenizer_config.json", config.dump());
    return tmp_ / "albert";
  }
  TempDir tmp_;
};

TEST_F(SentencePieceFiles, FilesItCannotReadAreRefusedNamingTheKeyAndWhatIsAllowed) {
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
  };
  for (const auto& c : cases) {
    const std::string msg = error_of(with_config(c.edit));
    EXPECT_NE(msg.find(config + c.message), std::string::npos) << msg << "\n  expected " << c.message;
  }
  // The model itself: not a protocol buffer of a model, or cut short.
  with_config([](nlohmann::json&) {});
  write_file(tmp_ / "albert/spiece.model", "not a model at all");
  EXPECT_NE(error_of(tmp_ / "albert").find("albert/spiece.model: not a SentencePiece model ("), std::string::npos)
      << error_of(tmp_ / "albert");
  const std::string model = read_file(kFixtures + "/albert/spiece.model");
  write_file(tmp_ / "albert/spiece.model", model.substr(0, model.size() / 2));
  EXPECT_NE(error_of(tmp_ / "albert").find("albert/spiece.model: not a SentencePiece model ("), std::string::npos);
  // Without tokenizer_config.json, or with one that is not JSON.
  fs::remove(config);
  EXPECT_NE(error_of(tmp_ / "albert")
                .find("spiece.model: no tokenizer_config.json beside it, which names the "
                      "tokenizer's class"),
            std::string::npos)
      << error_of(tmp_ / "albert");
  write_file(config, "{\"tokenizer_class\": ");
  EXPECT_NE(error_of(tmp_ / "albert").find(config + ": not a tokenizer_config.json"), std::string::npos);
  // A path that holds no tokenizer.
  EXPECT_NE(error_of(tmp_ / "nowhere").find("nowhere: no such file (a tokenizer.json, a SentencePiece .model"),
            std::string::npos);
  fs::create_directories(tmp_ / "empty");
  EXPECT_NE(error_of(tmp_ / "empty").find("empty: a directory without a tokenizer"), std::string::npos);
}

}  // namespace
