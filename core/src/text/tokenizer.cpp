#include "text/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "text/tokenizer_impl.h"
#include "text/unicode.h"
#include "trainer/error.h"
#include "trainer/json.h"

namespace trainer::text {

namespace fs = std::filesystem;

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  TRAINER_CHECK(impl_ != nullptr, "a tokenizer without a file's reading");
}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

/// The largest tokenizer.json read (the largest published ones, of vocabularies of 250,000
/// tokens and more, are some tens of MB).
constexpr std::uintmax_t kMaxJsonBytes = std::uintmax_t{256} << 20;
/// The largest tokenizer_config.json read (chat templates make some a few hundred KB).
constexpr std::uintmax_t kMaxConfigBytes = std::uintmax_t{16} << 20;

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

}  // namespace

std::string detail::read_bounded(const fs::path& file, std::uintmax_t most, const char* what) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  TRAINER_CHECK_T(UsageError, !ec, file.string(), ": cannot read ", what, " (", ec.message(), ")");
  TRAINER_CHECK_T(UsageError, size <= most, file.string(), " is ", size, " bytes; ", what, " is at most ", most,
                  " bytes here");
  std::ifstream in(file, std::ios::binary);
  TRAINER_CHECK_T(UsageError, in.good(), file.string(), ": cannot open ", what);
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  TRAINER_CHECK_T(UsageError, in.gcount() == static_cast<std::streamsize>(size) && in.peek() == EOF, file.string(),
                  ": the file changed while it was read");
  return text;
}

namespace {

/// transformers' fast tokenizers take the length and strategy of their truncation from the
/// call (here dataset.max_length) and the side from tokenizer_config.json's truncation_side, or
/// where it has none from the tokenizer.json's truncation.direction. trainer cuts a text at its
/// end: a side "left" is refused, naming the file that says it. `config` is the
/// tokenizer_config.json beside the file (none: empty).
void check_truncation_side(const Tokenizer::Impl& impl, const fs::path& config) {
  if (!config.empty() && is_file(config)) {
    const nlohmann::json c = detail::parse_tokenizer_config(detail::read_tokenizer_config(config), config.string());
    // The side the call takes, whatever the tokenizer.json says.
    if (detail::names_truncation_side(c, config.string())) return;
  }
  TRAINER_CHECK_T(UsageError, !impl.truncates_left, impl.name,
                  ": truncation.direction: \"Left\" (transformers then cuts a text at its start) is not read; trainer "
                  "cuts at the end (\"Right\"; or a tokenizer_config.json beside the file with truncation_side = "
                  "\"right\")");
}

}  // namespace

std::string detail::read_tokenizer_config(const fs::path& file) {
  return read_bounded(file, kMaxConfigBytes, "a tokenizer_config.json");
}

nlohmann::json detail::parse_tokenizer_config(const std::string& text, const std::string& name) {
  TRAINER_CHECK_T(UsageError, json_nesting(text) <= 16, name, ": JSON nested deeper than a tokenizer_config.json is");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: not a tokenizer_config.json: {}", name, e.what()));
  }
}

bool detail::names_truncation_side(const nlohmann::json& config, const std::string& name) {
  if (!config.is_object()) return false;
  const auto side = config.find("truncation_side");
  if (side == config.end() || side->is_null()) return false;
  TRAINER_CHECK_T(UsageError, *side == "right", name,
                  ": truncation_side: only \"right\" (the default: a text is cut at its end) is read, not ",
                  side->dump().substr(0, 40));
  return true;
}

Tokenizer Tokenizer::from_file(const fs::path& file) {
  auto impl = detail::read_tokenizer_json(detail::read_bounded(file, kMaxJsonBytes, "a tokenizer.json"), file.string());
  check_truncation_side(*impl, file.parent_path() / "tokenizer_config.json");
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_path(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* model : {"spiece.model", "spm.model"}) {
      if (is_file(path / model))
        return Tokenizer(detail::read_sentencepiece(path / model, path / "tokenizer_config.json"));
    }
    TRAINER_CHECK_T(UsageError, is_file(path / "tokenizer.json"), path.string(),
                    ": a directory without a tokenizer (spiece.model or spm.model with tokenizer_config.json, or "
                    "tokenizer.json, as transformers' save_pretrained writes them)");
    return from_file(path / "tokenizer.json");
  }
  TRAINER_CHECK_T(UsageError, is_file(path), path.string(),
                  ": no such file (a tokenizer.json, a SentencePiece .model, or a model directory holding one)");
  if (path.extension() == ".model") {
    return Tokenizer(detail::read_sentencepiece(path, path.parent_path() / "tokenizer_config.json"));
  }
  return from_file(path);
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& name) {
  auto impl = detail::read_tokenizer_json(text, name);
  check_truncation_side(*impl, {});
  return Tokenizer(std::move(impl));
}

Encoding Tokenizer::encode(std::string_view text, std::optional<std::string_view> pair, std::int64_t max_length) const {
  const Impl& m = *impl_;
  for (const auto s : {std::optional<std::string_view>(text), pair}) {
    TRAINER_CHECK_T(UsageError, !s || invalid_utf8_at(*s) == std::string_view::npos,
                    "a text is not valid UTF-8 (at byte ", s ? invalid_utf8_at(*s) : 0, ")");
  }
  std::vector<std::int64_t> a = m.tokenize(text), b;
  if (pair) b = m.tokenize(*pair);
  const std::size_t before = a.size() + b.size();
  if (max_length > 0) {
    const std::int64_t added = special_tokens_added(pair.has_value());
    TRAINER_CHECK_T(UsageError, max_length >= added, "a maximum length of ", max_length, " is less than the ", added,
                    " special tokens");
    const auto most = static_cast<std::size_t>(max_length - added);
    if (!pair) {
      // transformers' Python tokenizers leave a text uncut when cutting would take all of it
      // (max_length of just the special tokens; the dataset refuses that length).
      if (a.size() > most && !(m.cut_one_at_a_time && most == 0)) a.resize(most);
    } else if (a.size() + b.size() > most && m.cut_one_at_a_time) {
      const std::size_t cut = a.size() + b.size() - most;
      // Cutting one at a time from the longer: first the longer down to the shorter's length,
      // then both in turn (the second first).
      const std::size_t gap = a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
      const std::size_t first = std::min(cut, gap), rest = cut - first;
      if (a.size() > b.size()) {
        a.resize(a.size() - first);
      } else {
        b.resize(b.size() - first);
      }
      b.resize(b.size() - (rest + 1) / 2);
      a.resize(a.size() - rest / 2);
    } else if (a.size() + b.size() > most) {
      // longest_first: the shorter keeps its length when the longer can take the cut; else
      // both are cut to about half.
      std::size_t n1 = std::min(a.size(), b.size()), n2 = 0;
      n2 = n1 > most ? n1 : std::max(n1, most - n1);
      if (n1 + n2 > most) {
        n1 = most / 2;
        n2 = n1 + most % 2;
      }
      if (a.size() > b.size()) std::swap(n1, n2);
      a.resize(std::min(a.size(), n1));
      b.resize(std::min(b.size(), n2));
    }
  }
  Encoding e;
  e.truncated = static_cast<std::int64_t>(before - a.size() - b.size());
  const std::vector<std::int64_t>* last = nullptr;  // the text the piece before was
  for (const auto& piece : pair ? m.pair : m.single) {
    const std::vector<std::int64_t>& ids = piece.sequence < 0 ? piece.ids : piece.sequence == 0 ? a : b;
    if (m.close_once && piece.sequence < 0 && last != nullptr && !last->empty() && last->back() == ids.back()) {
      last = nullptr;
      continue;  // the text ends with the closing token already (T5Tokenizer adds none then)
    }
    last = piece.sequence < 0 ? nullptr : &ids;
    e.ids.insert(e.ids.end(), ids.begin(), ids.end());
    e.type_ids.insert(e.type_ids.end(), ids.size(), piece.type_id);
    e.special_mask.insert(e.special_mask.end(), ids.size(), piece.sequence < 0 ? 1 : 0);
  }
  return e;
}

std::optional<std::int64_t> Tokenizer::token_id(const std::string& token) const {
  const auto a = impl_->added_ids.find(token);
  if (a != impl_->added_ids.end()) return a->second;
  return impl_->vocab_id(token);
}

std::int64_t Tokenizer::id_limit() const { return impl_->limit; }

std::optional<std::int64_t> Tokenizer::pad_id() const {
  if (impl_->padding_id) return impl_->padding_id;
  for (const char* t : {"[PAD]", "<pad>"}) {
    if (auto id = token_id(t)) return id;
  }
  return std::nullopt;
}

std::optional<std::int64_t> Tokenizer::mask_id() const {
  if (impl_->mask_id) return impl_->mask_id;
  for (const char* t : {"[MASK]", "<mask>"}) {
    if (auto id = token_id(t)) return id;
  }
  return std::nullopt;
}

std::int64_t Tokenizer::special_tokens_added(bool pair) const {
  std::int64_t n = 0;
  for (const auto& piece : pair ? impl_->pair : impl_->single) n += static_cast<std::int64_t>(piece.ids.size());
  return n;
}

const std::string& Tokenizer::model_type() const { return impl_->model_type; }

const std::string& Tokenizer::file() const { return impl_->name; }

}  // namespace trainer::text
