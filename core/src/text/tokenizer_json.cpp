// A tokenizer.json (Hugging Face tokenizers' file) read into its pipeline.
#include "text/tokenizer_impl.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "text/added_tokens.h"
#include "text/tokenizer_parts.h"
#include "text/unicode.h"
#include "trainer/error.h"
#include "trainer/json.h"

namespace trainer::text {

using detail::AddedToken;
using detail::AddedTokens;
using detail::Bpe;
using detail::Normalizer;
using detail::PreTokenizer;
using detail::Segment;
using detail::WordPiece;
using nlohmann::json;

/// A tokenizer.json's pipeline: normalizer, pre-tokenizer, model, added tokens, post-processor.
struct JsonTokenizer final : Tokenizer::Impl {
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  WordPiece wordpiece;
  Bpe bpe;
  AddedTokens raw_tokens, normalized_tokens;

  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    throw UsageError(fmt::format("{}: {}: {}", name, key, what));
  }

  const json& field(const json& j, const char* key, const std::string& where) const {
    const auto it = j.find(key);
    if (it == j.end()) bad(where, std::string("has no \"") + key + "\"");
    return *it;
  }
  bool flag(const json& j, const char* key, const std::string& where, bool fallback) const {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) bad(where + "." + key, "expected true or false, not " + it->dump().substr(0, 40));
    return it->get<bool>();
  }
  std::string text(const json& j, const std::string& where) const {
    if (!j.is_string()) bad(where, "expected a string, not " + j.dump().substr(0, 40));
    const auto s = j.get<std::string>();
    if (invalid_utf8_at(s) != std::string::npos) bad(where, "not valid UTF-8");
    return s;
  }
  std::int64_t id(const json& j, const std::string& where) const {
    if (!j.is_number_integer() || j.get<std::int64_t>() < 0 ||
        j.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
      bad(where, "expected a token id from 0 to 2^31 - 1, not " + j.dump().substr(0, 40));
    }
    return j.get<std::int64_t>();
  }
  std::string type_of(const json& j, const std::string& where) const {
    if (!j.is_object()) bad(where, "expected an object, not " + j.dump().substr(0, 40));
    return text(field(j, "type", where), where + ".type");
  }

  Normalizer read_normalizer(const json& j, const std::string& where) const {
    const std::string type = type_of(j, where);
    Normalizer n;
    if (type == "BertNormalizer") {
      n.kind = Normalizer::Kind::kBert;
      n.clean_text = flag(j, "clean_text", where, true);
      n.chinese_chars = flag(j, "handle_chinese_chars", where, true);
      n.lowercase = flag(j, "lowercase", where, true);
      n.strip_accents = flag(j, "strip_accents", where, n.lowercase);  // null: as lowercase
    } else if (type == "Lowercase") {
      n.kind = Normalizer::Kind::kLowercase;
    } else if (type == "NFD") {
      n.kind = Normalizer::Kind::kNfd;
    } else if (type == "StripAccents") {
      n.kind = Normalizer::Kind::kStripAccents;
    } else if (type == "Sequence") {
      n.kind = Normalizer::Kind::kSequence;
      const json& steps = field(j, "normalizers", where);
      if (!steps.is_array()) bad(where + ".normalizers", "expected a list");
      for (std::size_t k = 0; k < steps.size(); ++k) {
        n.steps.push_back(read_normalizer(steps[k], fmt::format("{}.normalizers[{}]", where, k)));
      }
    } else {
      bad(where + ".type", fmt::format("\"{}\" is not a normalizer this reader has; it has BertNormalizer, "
                                       "Lowercase, NFD, StripAccents and Sequence",
                                       type));
    }
    return n;
  }

  PreTokenizer read_pre_tokenizer(const json& j, const std::string& where) const {
    const std::string type = type_of(j, where);
    PreTokenizer p;
    if (type == "BertPreTokenizer") {
      p.kind = PreTokenizer::Kind::kBert;
    } else if (type == "WhitespaceSplit") {
      p.kind = PreTokenizer::Kind::kWhitespaceSplit;
    } else if (type == "ByteLevel") {
      p.kind = PreTokenizer::Kind::kByteLevel;
      p.add_prefix_space = flag(j, "add_prefix_space", where, true);
      p.use_regex = flag(j, "use_regex", where, true);
    } else if (type == "Sequence") {
      p.kind = PreTokenizer::Kind::kSequence;
      const json& steps = field(j, "pretokenizers", where);
      if (!steps.is_array()) bad(where + ".pretokenizers", "expected a list");
      for (std::size_t k = 0; k < steps.size(); ++k) {
        p.steps.push_back(read_pre_tokenizer(steps[k], fmt::format("{}.pretokenizers[{}]", where, k)));
      }
    } else {
      bad(where + ".type", fmt::format("\"{}\" is not a pre-tokenizer this reader has; it has BertPreTokenizer, "
                                       "ByteLevel, WhitespaceSplit and Sequence",
                                       type));
    }
    return p;
  }

  std::unordered_map<std::string, std::int64_t> read_vocab(const json& j, const std::string& where) {
    if (!j.is_object()) bad(where, "expected an object of tokens and their ids");
    std::unordered_map<std::string, std::int64_t> vocab;
    vocab.reserve(j.size());
    for (const auto& [token, value] : j.items()) {
      if (invalid_utf8_at(token) != std::string::npos) bad(where, "a token is not valid UTF-8");
      const std::int64_t v = id(value, where + "[" + json(token).dump() + "]");
      vocab.emplace(token, v);
      limit = std::max(limit, v + 1);
    }
    if (vocab.empty()) bad(where, "is empty");
    return vocab;
  }

  void read_model(const json& j) {
    const std::string type = type_of(j, "model");
    model_type = type;
    if (type == "WordPiece") {
      wordpiece.vocab = read_vocab(field(j, "vocab", "model"), "model.vocab");
      for (const auto& entry : wordpiece.vocab) wordpiece.longest = std::max(wordpiece.longest, entry.first.size());
      const std::string unk = text(field(j, "unk_token", "model"), "model.unk_token");
      const auto it = wordpiece.vocab.find(unk);
      if (it == wordpiece.vocab.end()) bad("model.unk_token", "\"" + unk + "\" is not in model.vocab");
      wordpiece.unk_id = it->second;
      if (j.contains("continuing_subword_prefix")) {
        wordpiece.prefix = text(j["continuing_subword_prefix"], "model.continuing_subword_prefix");
      }
      if (j.contains("max_input_chars_per_word")) {
        const json& m = j["max_input_chars_per_word"];
        if (!m.is_number_unsigned()) bad("model.max_input_chars_per_word", "expected a count");
        wordpiece.max_chars = m.get<std::size_t>();
      }
    } else if (type == "BPE") {
      bpe.vocab = read_vocab(field(j, "vocab", "model"), "model.vocab");
      if (j.contains("dropout") && !j["dropout"].is_null() &&
          !(j["dropout"].is_number() && j["dropout"].get<double>() == 0.0)) {
        bad("model.dropout", "BPE dropout draws merges at random; only null (none) is read");
      }
      if (j.contains("unk_token") && !j["unk_token"].is_null()) {
        const std::string unk = text(j["unk_token"], "model.unk_token");
        const auto it = bpe.vocab.find(unk);
        if (it == bpe.vocab.end()) bad("model.unk_token", "\"" + unk + "\" is not in model.vocab");
        bpe.unk_id = it->second;
      }
      for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        if (j.contains(key) && !j[key].is_null()) {
          (std::string(key) == "end_of_word_suffix" ? bpe.suffix : bpe.prefix) =
              text(j[key], std::string("model.") + key);
        }
      }
      bpe.fuse_unk = flag(j, "fuse_unk", "model", false);
      bpe.byte_fallback = flag(j, "byte_fallback", "model", false);
      if (flag(j, "ignore_merges", "model", false)) bad("model.ignore_merges", "only false is read");
      const json& merges = field(j, "merges", "model");
      if (!merges.is_array()) bad("model.merges", "expected a list");
      bpe.merges.reserve(merges.size());
      for (std::size_t k = 0; k < merges.size(); ++k) {
        const std::string where = fmt::format("model.merges[{}]", k);
        std::string a, b;
        if (merges[k].is_string()) {
          const std::string m = text(merges[k], where);
          const auto space = m.find(' ');
          if (space == std::string::npos || m.find(' ', space + 1) != std::string::npos) {
            bad(where, "\"" + m.substr(0, 40) + "\" is not two tokens with a space between");
          }
          a = m.substr(0, space);
          b = m.substr(space + 1);
        } else if (merges[k].is_array() && merges[k].size() == 2) {
          a = text(merges[k][0], where);
          b = text(merges[k][1], where);
        } else {
          bad(where, "expected \"A B\" or [\"A\", \"B\"]");
        }
        // The merged token: the right one less as many bytes as the continuing-subword prefix
        // has, as tokenizers builds it (whether or not it starts with the prefix).
        if (b.size() < bpe.prefix.size()) bad(where, "\"" + b + "\" is shorter than continuing_subword_prefix");
        const std::string merged = a + b.substr(bpe.prefix.size());
        const auto ia = bpe.vocab.find(a), ib = bpe.vocab.find(b), im = bpe.vocab.find(merged);
        if (ia == bpe.vocab.end() || ib == bpe.vocab.end() || im == bpe.vocab.end()) {
          bad(where, fmt::format("\"{}\", \"{}\" or their merge \"{}\" is not in model.vocab", a, b, merged));
        }
        const std::uint64_t key =
            (static_cast<std::uint64_t>(ia->second) << 32) | static_cast<std::uint64_t>(ib->second);
        // The last of equal pairs counts, as tokenizers' map of merges keeps it.
        bpe.merges[key] = Bpe::Merge{static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(im->second)};
      }
    } else {
      bad("model.type", fmt::format("\"{}\" is not a model this reader has; it has WordPiece (BERT) and BPE "
                                    "(RoBERTa, GPT-2)",
                                    type));
    }
  }

  std::vector<std::int64_t> special_ids(const json& j, const std::string& where) const {
    // [token, id] as BertProcessing and RobertaProcessing write them.
    if (!j.is_array() || j.size() != 2) bad(where, "expected [\"TOKEN\", ID]");
    text(j[0], where + "[0]");
    return {id(j[1], where + "[1]")};
  }

  void read_post_processor(const json& j, const std::string& where, bool& templated) {
    const std::string type = type_of(j, where);
    if (type == "ByteLevel") return;  // offsets only
    if (type == "Sequence") {
      const json& steps = field(j, "processors", where);
      if (!steps.is_array()) bad(where + ".processors", "expected a list");
      for (std::size_t k = 0; k < steps.size(); ++k) {
        read_post_processor(steps[k], fmt::format("{}.processors[{}]", where, k), templated);
      }
      return;
    }
    if (templated) bad(where, "a second processor that adds special tokens");
    templated = true;
    if (type == "BertProcessing" || type == "RobertaProcessing") {
      const auto cls = special_ids(field(j, "cls", where), where + ".cls");
      const auto sep = special_ids(field(j, "sep", where), where + ".sep");
      single = {{cls, -1, 0}, {{}, 0, 0}, {sep, -1, 0}};
      if (type == "BertProcessing") {
        pair = {{cls, -1, 0}, {{}, 0, 0}, {sep, -1, 0}, {{}, 1, 1}, {sep, -1, 1}};
      } else {
        pair = {{cls, -1, 0}, {{}, 0, 0}, {sep, -1, 0}, {sep, -1, 0}, {{}, 1, 0}, {sep, -1, 0}};
      }
      return;
    }
    if (type == "TemplateProcessing") {
      const json& specials = field(j, "special_tokens", where);
      if (!specials.is_object()) bad(where + ".special_tokens", "expected an object");
      const auto read = [&](const char* key) {
        const json& pieces = field(j, key, where);
        if (!pieces.is_array()) bad(where + "." + key, "expected a list");
        std::vector<detail::TemplatePiece> out;
        for (std::size_t k = 0; k < pieces.size(); ++k) {
          const std::string at = fmt::format("{}.{}[{}]", where, key, k);
          const json& p = pieces[k];
          if (!p.is_object() || p.size() != 1) bad(at, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
          detail::TemplatePiece piece;
          if (p.contains("Sequence")) {
            const std::string seq = text(field(p["Sequence"], "id", at), at + ".Sequence.id");
            if (seq != "A" && seq != "B") bad(at + ".Sequence.id", "expected \"A\" or \"B\"");
            piece.sequence = seq == "A" ? 0 : 1;
            piece.type_id = id(field(p["Sequence"], "type_id", at), at + ".Sequence.type_id");
          } else if (p.contains("SpecialToken")) {
            const std::string token = text(field(p["SpecialToken"], "id", at), at + ".SpecialToken.id");
            piece.type_id = id(field(p["SpecialToken"], "type_id", at), at + ".SpecialToken.type_id");
            if (!specials.contains(token)) bad(at, "\"" + token + "\" is not in " + where + ".special_tokens");
            const json& ids = field(specials[token], "ids", where + ".special_tokens." + token);
            if (!ids.is_array()) bad(where + ".special_tokens." + token + ".ids", "expected a list");
            for (const auto& i : ids) piece.ids.push_back(id(i, where + ".special_tokens." + token + ".ids"));
          } else {
            bad(at, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
          }
          out.push_back(std::move(piece));
        }
        return out;
      };
      single = read("single");
      pair = read("pair");
      const auto count = [](const std::vector<detail::TemplatePiece>& t, int seq) {
        return std::count_if(t.begin(), t.end(), [&](const detail::TemplatePiece& p) { return p.sequence == seq; });
      };
      if (count(single, 0) != 1 || count(single, 1) != 0) bad(where + ".single", "expected $A once and no $B");
      if (count(pair, 0) != 1 || count(pair, 1) != 1) bad(where + ".pair", "expected $A and $B once each");
      return;
    }
    bad(where + ".type", fmt::format("\"{}\" is not a post-processor this reader has; it has TemplateProcessing, "
                                     "BertProcessing, RobertaProcessing, ByteLevel and Sequence",
                                     type));
  }

  /// The vocabulary of the model (WordPiece's or BPE's).
  const std::unordered_map<std::string, std::int64_t>& model_vocab() const {
    return model_type == "WordPiece" ? wordpiece.vocab : bpe.vocab;
  }
  std::optional<std::int64_t> vocab_id(const std::string& token) const override {
    const auto& vocab = model_vocab();
    const auto v = vocab.find(token);
    if (v == vocab.end()) return std::nullopt;
    return v->second;
  }

  void read_added_tokens(const json& j) {
    if (!j.is_array()) bad("added_tokens", "expected a list");
    struct Entry {
      AddedToken token;
      bool special, normalized;
    };
    std::vector<Entry> entries;
    const auto& vocab = model_vocab();
    const auto vocab_size = static_cast<std::int64_t>(vocab.size());
    std::int64_t most = -1;  // the largest added id so far
    for (std::size_t k = 0; k < j.size(); ++k) {
      const std::string where = fmt::format("added_tokens[{}]", k);
      const json& t = j[k];
      if (!t.is_object()) bad(where, "expected an object");
      Entry e;
      AddedToken& a = e.token;
      a.content = text(field(t, "content", where), where + ".content");
      if (a.content.empty()) bad(where + ".content", "is empty");
      id(field(t, "id", where), where + ".id");  // checked; tokenizers assigns the id itself:
      // the token's id in the vocabulary, an earlier entry's, or the next after both.
      if (const auto seen = added_ids.find(a.content); seen != added_ids.end()) {
        a.id = seen->second;
      } else if (const auto in_vocab = vocab.find(a.content); in_vocab != vocab.end()) {
        a.id = in_vocab->second;
      } else {
        a.id = most < 0 ? vocab_size : (most >= vocab_size || vocab_size == 0 ? most + 1 : vocab_size);
      }
      most = std::max(most, a.id);
      a.single_word = flag(t, "single_word", where, false);
      a.lstrip = flag(t, "lstrip", where, false);
      a.rstrip = flag(t, "rstrip", where, false);
      e.special = flag(t, "special", where, false);
      // tokenizers' default: special tokens are matched as written, others after normalizing.
      e.normalized = flag(t, "normalized", where, !e.special);
      limit = std::max(limit, a.id + 1);
      added_ids[a.content] = a.id;
      entries.push_back(std::move(e));
    }
    // tokenizers matches the special tokens first (each once), then the others, in file order:
    // of two that match the same text, the first listed wins.
    std::set<std::string> specials;
    for (const bool special : {true, false}) {
      for (auto& e : entries) {
        if (e.special != special || (special && !specials.insert(e.token.content).second)) continue;
        AddedToken a = e.token;
        if (e.normalized && normalizer) {
          std::u32string s = decode_utf8(a.content);
          normalizer->apply(s);
          a.content = encode_utf8(s);
          if (!a.content.empty()) normalized_tokens.add(std::move(a));
        } else {
          (e.normalized ? normalized_tokens : raw_tokens).add(std::move(a));
        }
      }
    }
    raw_tokens.finish();
    normalized_tokens.finish();
  }

  /// The model's ids for one text, before the post-processor.
  std::vector<std::int64_t> tokenize(std::string_view input) const override {
    std::vector<Segment> raw, segments;
    raw_tokens.split(std::string(input), raw);
    for (auto& seg : raw) {
      if (seg.id >= 0) {
        segments.push_back(std::move(seg));
        continue;
      }
      std::u32string s = decode_utf8(seg.text);
      if (normalizer) normalizer->apply(s);
      normalized_tokens.split(encode_utf8(s), segments);
    }
    std::vector<std::int64_t> ids;
    for (const auto& seg : segments) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
        continue;
      }
      std::vector<std::u32string> words{decode_utf8(seg.text)};
      if (pre_tokenizer) pre_tokenizer->apply(words);
      for (const auto& w : words) {
        if (w.empty()) continue;
        const std::string word = encode_utf8(w);
        if (model_type == "WordPiece") {
          wordpiece.tokenize(word, ids);
        } else {
          bpe.tokenize(word, ids);
        }
      }
    }
    return ids;
  }
};

std::unique_ptr<Tokenizer::Impl> detail::read_tokenizer_json(const std::string& text, const std::string& name) {
  auto impl = std::make_unique<JsonTokenizer>();
  impl->name = name;
  TRAINER_CHECK_T(UsageError, json_nesting(text) <= 16, name, ": JSON nested deeper than a tokenizer.json is");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw UsageError(fmt::format("{}: not a tokenizer.json: invalid JSON at byte {}", name, e.byte));
  } catch (const json::exception& e) {
    // A number out of range, which the parser reports apart.
    throw UsageError(fmt::format("{}: not a tokenizer.json: {}", name, e.what()));
  }
  TRAINER_CHECK_T(UsageError, j.is_object(), name,
                  ": not a tokenizer.json (a JSON object with a \"model\"; transformers' save_pretrained writes it)");
  impl->read_model(impl->field(j, "model", "the file"));
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    impl->normalizer = impl->read_normalizer(j["normalizer"], "normalizer");
  }
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    impl->pre_tokenizer = impl->read_pre_tokenizer(j["pre_tokenizer"], "pre_tokenizer");
  }
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    bool templated = false;
    impl->read_post_processor(j["post_processor"], "post_processor", templated);
  }
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) impl->read_added_tokens(j["added_tokens"]);
  if (j.contains("padding") && !j["padding"].is_null() && !j["padding"].is_object()) {
    impl->bad("padding", "expected an object or null, not " + j["padding"].dump().substr(0, 40));
  }
  if (j.contains("truncation") && !j["truncation"].is_null()) {
    // Its length and strategy are the call's in transformers (here dataset.max_length's); its
    // direction is the default side of the cut.
    const json& t = j["truncation"];
    if (!t.is_object()) impl->bad("truncation", "expected an object or null, not " + t.dump().substr(0, 40));
    if (t.contains("direction") && !t["direction"].is_null()) {
      const std::string d = impl->text(t["direction"], "truncation.direction");
      if (d != "Right" && d != "Left")
        impl->bad("truncation.direction", "expected \"Right\" or \"Left\", not \"" + d + "\"");
      impl->truncates_left = d == "Left";
    }
  }
  if (j.contains("padding") && j["padding"].is_object() && j["padding"].contains("pad_id")) {
    impl->padding_id = impl->id(j["padding"]["pad_id"], "padding.pad_id");
    impl->limit = std::max(impl->limit, *impl->padding_id + 1);
  }
  // The post-processor's ids count too: a model for the tokenizer must have rows for them.
  for (const auto* t : {&impl->single, &impl->pair}) {
    for (const auto& piece : *t) {
      for (const auto id : piece.ids) impl->limit = std::max(impl->limit, id + 1);
    }
  }
  // A model gets a row per id below the limit: ids far beyond the tokens would make a huge one.
  const auto tokens = static_cast<std::int64_t>(impl->model_vocab().size() + impl->added_ids.size());
  TRAINER_CHECK_T(UsageError, impl->limit <= 2 * tokens + 1024, name, ": ids run up to ", impl->limit - 1, " for ",
                  tokens,
                  " tokens; a vocabulary's ids are 0 to about its size (a model would get a row for "
                  "each)");
  return impl;
}

}  // namespace trainer::text
