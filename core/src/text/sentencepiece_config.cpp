// Reading transformers' tokenizer_config.json beside a SentencePiece model: the tokenizer's
// class and options, its added tokens with the ids transformers gives them, its special tokens
// by role and the tokens around a text. Every key read is checked; what would change the
// tokens in a way not read here is refused, naming the key.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "text/sentencepiece_tokenizer.h"
#include "text/unicode.h"
#include "trainer/error.h"

namespace trainer::text::detail {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// The largest SentencePiece model read: published ones are a few MB (mT5's 4.3 MB, XLM-R's 5 MB).
constexpr std::uintmax_t kMaxModelBytes = std::uintmax_t{64} << 20;
/// The most special tokens, and bytes of special or added tokens, read (T5 has 100 sentinels;
/// the tries that match them grow with their bytes).
constexpr std::size_t kMaxSpecialTokens = 100'000;
constexpr std::size_t kMaxSpecialBytes = std::size_t{4} << 20;

[[noreturn]] void bad(const std::string& file, const std::string& key, const std::string& what) {
  throw UsageError(fmt::format("{}: {}: {}", file, key, what));
}

bool flag(const json& j, const char* key, const std::string& file, const std::string& where, bool fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad(file, where + key, "expected true or false, not " + it->dump().substr(0, 40));
  return it->get<bool>();
}

/// A special token's content: a string, or an object with "content" (as special_tokens_map
/// writes them); nullopt when the key is absent or null.
std::optional<std::string> token_named(const json& config, const char* key, const std::string& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  const json& v = it->is_object() && it->contains("content") ? (*it)["content"] : *it;
  if (!v.is_string() || v.get<std::string>().empty() || invalid_utf8_at(v.get<std::string>()) != std::string::npos) {
    bad(file, key, "expected a token (a non-empty string), not " + it->dump().substr(0, 40));
  }
  return v.get<std::string>();
}

}  // namespace

std::unique_ptr<Tokenizer::Impl> sentencepiece_from_config(
    const std::string& text, const std::string& cfg_name, const std::string& model_name,
    const std::function<std::unique_ptr<SentencePieceModel>()>& load) {
  using Kind = SentencePieceKind;
  auto t = std::make_unique<SentencePieceTokenizer>();
  t->name = model_name;
  t->model_type = "SentencePiece";
  t->cut_one_at_a_time = true;
  const json c = parse_tokenizer_config(text, cfg_name);
  if (!c.is_object()) bad(cfg_name, "the file", "expected a JSON object (transformers' tokenizer_config.json)");

  // The class, which decides the preprocessing and the special tokens around a text.
  static const std::map<std::string, Kind> kClasses = {{"T5Tokenizer", Kind::kT5},
                                                       {"T5TokenizerFast", Kind::kT5},
                                                       {"AlbertTokenizer", Kind::kAlbert},
                                                       {"AlbertTokenizerFast", Kind::kAlbert},
                                                       {"DebertaV2Tokenizer", Kind::kDebertaV2},
                                                       {"DebertaV2TokenizerFast", Kind::kDebertaV2}};
  const auto cls = token_named(c, "tokenizer_class", cfg_name);
  if (!cls || kClasses.count(*cls) == 0) {
    bad(cfg_name, "tokenizer_class",
        fmt::format("{} is not a SentencePiece tokenizer read here; allowed: T5Tokenizer, AlbertTokenizer, "
                    "DebertaV2Tokenizer (or their Fast names)",
                    cls ? "\"" + *cls + "\"" : std::string("missing")));
  }
  t->kind = kClasses.at(*cls);
  // T5Tokenizer has no do_lower_case: transformers leaves the key unread there, and so does this.
  t->do_lower_case = t->kind != Kind::kT5 && flag(c, "do_lower_case", cfg_name, "", t->kind == Kind::kAlbert);
  t->remove_space = flag(c, "remove_space", cfg_name, "", true);
  t->keep_accents = flag(c, "keep_accents", cfg_name, "", false);
  if (t->kind == Kind::kT5 && !flag(c, "legacy", cfg_name, "", true)) {
    bad(cfg_name, "legacy",
        "false is T5Tokenizer's newer handling of the text after a special token, not read here; "
        "legacy = true (the default, as T5 and FLAN-T5 were trained) is");
  }
  if (t->kind == Kind::kDebertaV2 && flag(c, "split_by_punct", cfg_name, "", false)) {
    bad(cfg_name, "split_by_punct", "true is not read here (DeBERTa-v3's files have false)");
  }

  // What would change the pieces or the truncation in ways not read here.
  if (flag(c, "split_special_tokens", cfg_name, "", false)) {
    bad(cfg_name, "split_special_tokens", "true (special tokens tokenized as text) is not read here");
  }
  names_truncation_side(c, cfg_name);
  if (const auto kw = c.find("sp_model_kwargs"); kw != c.end() && !kw->is_null() && !(kw->is_object() && kw->empty())) {
    bad(cfg_name, "sp_model_kwargs",
        "options of the SentencePiece processor (sampling, ...) are not read here; expected {}, not " +
            kw->dump().substr(0, 60));
  }

  // The model, once the file is known to be one read here.
  t->sp = load();
  TRAINER_CHECK(t->sp != nullptr, model_name, ": no SentencePiece model was loaded");
  const auto pieces = static_cast<std::int64_t>(t->sp->size());
  TRAINER_CHECK_T(UsageError, pieces > 0, model_name, ": a SentencePiece model without pieces");
  t->limit = pieces;

  // The added tokens, with the ids transformers gives them.
  const auto decoder = c.find("added_tokens_decoder");
  if (decoder == c.end() || !decoder->is_object()) {
    bad(cfg_name, "added_tokens_decoder",
        "missing: transformers before 4.34 did not write it; save the tokenizer again with a newer one "
        "(AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))");
  }
  for (const auto& [key, v] : decoder->items()) {
    const std::string where = "added_tokens_decoder." + key;
    SentencePieceAdded a;
    std::size_t used = 0;
    try {
      a.id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != key.size() || used == 0 || a.id < 0 || a.id > pieces + 1'000'000) {
      bad(cfg_name, where,
          fmt::format("expected an id from 0 to the vocabulary's size ({}) plus the added tokens", pieces));
    }
    if (!v.is_object()) bad(cfg_name, where, "expected an object");
    const auto content = token_named(v, "content", cfg_name);
    if (!content) bad(cfg_name, where + ".content", "missing");
    a.content = *content;
    a.lstrip = flag(v, "lstrip", cfg_name, where + ".", false);
    a.rstrip = flag(v, "rstrip", cfg_name, where + ".", false);
    a.single_word = flag(v, "single_word", cfg_name, where + ".", false);
    a.special = flag(v, "special", cfg_name, where + ".", false);
    a.normalized = flag(v, "normalized", cfg_name, where + ".", !a.special);
    if (t->added_ids.count(a.content) != 0) bad(cfg_name, where, "\"" + a.content + "\" is listed twice");
    t->added_ids[a.content] = a.id;
    t->limit = std::max(t->limit, a.id + 1);
    t->added.push_back(std::move(a));
  }
  TRAINER_CHECK_T(UsageError, t->limit <= 2 * pieces + 1024, cfg_name, ": added token ids run up to ", t->limit - 1,
                  " for a model of ", pieces, " pieces (a model would get a row for each id)");

  // Special tokens by role, as transformers lists them (all_special_tokens). transformers adds
  // a role's token that the file's added tokens lack as one (its piece's id, matched as written).
  std::vector<std::string> specials;
  std::unordered_set<std::string> listed;
  std::size_t special_bytes = 0;
  const auto add_special = [&](const std::string& tok, const std::string& key) {
    if (!listed.insert(tok).second) return;
    special_bytes += tok.size();
    TRAINER_CHECK_T(UsageError, listed.size() <= kMaxSpecialTokens && special_bytes <= kMaxSpecialBytes, cfg_name,
                    ": more special tokens than are read here (", kMaxSpecialTokens, " tokens, ", kMaxSpecialBytes,
                    " bytes)");
    specials.push_back(tok);
    if (t->added_ids.count(tok) != 0) return;
    const auto v = t->vocab_id(tok);
    if (!v)
      bad(cfg_name, key,
          "\"" + tok + "\" is neither an added token nor a piece of " + fs::path(model_name).filename().string());
    SentencePieceAdded a;
    a.content = tok;
    a.id = *v;
    a.special = true;
    t->added_ids[tok] = a.id;
    t->added.push_back(std::move(a));
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (const auto tok = token_named(c, key, cfg_name)) add_special(*tok, key);
  }
  if (const auto extra = c.find("additional_special_tokens"); extra != c.end() && !extra->is_null()) {
    if (!extra->is_array()) bad(cfg_name, "additional_special_tokens", "expected a list of tokens");
    TRAINER_CHECK_T(UsageError, extra->size() <= kMaxSpecialTokens, cfg_name,
                    ": more special tokens than are read here (", kMaxSpecialTokens, " tokens, ", kMaxSpecialBytes,
                    " bytes)");
    for (const auto& e : *extra) {
      const json& v = e.is_object() && e.contains("content") ? e["content"] : e;
      if (!v.is_string() || v.get<std::string>().empty() ||
          invalid_utf8_at(v.get<std::string>()) != std::string::npos) {
        bad(cfg_name, "additional_special_tokens",
            "expected tokens (non-empty strings), not " + e.dump().substr(0, 40));
      }
      add_special(v.get<std::string>(), "additional_special_tokens");
    }
  }
  std::size_t added_bytes = 0;
  for (std::size_t i = 0; i < t->added.size(); ++i) {
    added_bytes += t->added[i].content.size();
    TRAINER_CHECK_T(UsageError, added_bytes <= kMaxSpecialBytes, cfg_name, ": added tokens of more than ",
                    kMaxSpecialBytes, " bytes in all, which is more than is read here");
    t->added_trie.add(t->added[i].content, static_cast<std::int32_t>(i));
  }
  std::int32_t order = 0;
  for (const auto& tok : specials) t->kept_case.add(tok, order++);
  for (const auto& a : t->added) {
    if (!a.special && a.normalized) t->kept_case.add(a.content, order++);
  }
  const auto id_of = [&](const char* key) -> std::optional<std::int64_t> {
    const auto tok = token_named(c, key, cfg_name);
    if (!tok) return std::nullopt;
    return t->added_ids.at(*tok);  // each role's token is an added token by now
  };
  t->padding_id = id_of("pad_token");
  t->mask_id = id_of("mask_token");

  // The special tokens around a text: T5's closing </s>; ALBERT's and DeBERTa's [CLS] and [SEP].
  if (t->kind == Kind::kT5) {
    const auto eos = id_of("eos_token");
    if (!eos) bad(cfg_name, "eos_token", "missing: T5Tokenizer closes each text with it");
    t->single = {{{}, 0, 0}, {{*eos}, -1, 0}};
    t->pair = {{{}, 0, 0}, {{*eos}, -1, 0}, {{}, 1, 0}, {{*eos}, -1, 0}};
    t->close_once = true;
  } else {
    const auto cls_id = id_of("cls_token"), sep = id_of("sep_token");
    if (!cls_id || !sep)
      bad(cfg_name, cls_id ? "sep_token" : "cls_token", std::string("missing: ") + *cls + " puts it around each text");
    t->single = {{{*cls_id}, -1, 0}, {{}, 0, 0}, {{*sep}, -1, 0}};
    t->pair = {{{*cls_id}, -1, 0}, {{}, 0, 0}, {{*sep}, -1, 0}, {{}, 1, 1}, {{*sep}, -1, 1}};
  }
  return t;
}

std::unique_ptr<Tokenizer::Impl> read_sentencepiece(const fs::path& model, const fs::path& config) {
  std::error_code ec;
  TRAINER_CHECK_T(UsageError, fs::is_regular_file(config, ec), model.string(),
                  ": no tokenizer_config.json beside it, which names the tokenizer's class and its special tokens "
                  "(transformers' save_pretrained writes it: AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))");
  const std::string text = read_tokenizer_config(config);
  // The model, through libsentencepiece (its parser checks the protocol buffer; the tables it
  // walks unchecked are checked first).
  return sentencepiece_from_config(text, config.string(), model.string(), [&] {
    const std::string bytes = read_bounded(model, kMaxModelBytes, "a SentencePiece model");
    check_normalizers(bytes, model.string());
    return load_sentencepiece(bytes, model.string());
  });
}

}  // namespace trainer::text::detail
