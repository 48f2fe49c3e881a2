// The dataset "text": texts (and optionally a second text each, a pair) with class labels, from
// CSV/TSV or JSON Lines files (read by text_rows.cpp), tokenized once with the tokenizer as they
// are read. A batch is
// the ids, the attention mask and the token types [N, 3, L], padded to its longest sample (L;
// with padding = "max_length", to max_length), with the labels [N], or, for masked language
// modelling, the hidden tokens [N, L] (-100 where none is). Bad rows are errors naming the file and line, or skipped
// and counted.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/logger.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/array_datasets.h"
#include "data/text_dataset.h"
#include "data/text_masking.h"
#include "data/text_rows.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/json.h"
#include "trainer/logging.h"
#include "trainer/settings.h"

namespace trainer::detail {

namespace {

namespace fs = std::filesystem;
using text_data::read_rows;
using text_data::Row;
using text_data::shown;
using text_data::text_problem;
using text_data::TextSettings;

struct Classes {
  std::map<std::string, std::int64_t> by_name;
  std::int64_t count = 0;
  bool indices = false;  ///< the labels are class indices
  std::string described;

  std::optional<std::int64_t> of(const Row& r) const {
    const auto it = by_name.find(r.label);
    if (it != by_name.end()) return it->second;
    if (indices && r.label_is_integer) {
      std::int64_t v = 0;
      const auto parsed = std::from_chars(r.label.data(), r.label.data() + r.label.size(), v);
      if (parsed.ec == std::errc() && v < count) return v;
    }
    return std::nullopt;
  }
};

Classes classes_of(const TextSettings& s, const std::vector<Row>& train_rows, const std::string& train_path) {
  Classes c;
  if (!s.labels.empty()) {
    for (std::size_t i = 0; i < s.labels.size(); ++i) {
      const bool fresh = c.by_name.emplace(s.labels[i], static_cast<std::int64_t>(i)).second;
      TRAINER_CHECK_T(UsageError, fresh, "dataset.labels: '", s.labels[i], "' twice");
    }
    c.count = static_cast<std::int64_t>(s.labels.size());
    c.indices = true;  // an integer label may also name a class by its index
    c.described = "dataset.labels: " + fmt::format("{}", fmt::join(s.labels, ", "));
    return c;
  }
  bool all_integers = true;
  const Row* first = nullptr;
  const Row* largest = nullptr;  // of the class indices
  std::uint64_t most = 0;
  std::int64_t rows = 0;
  std::vector<std::string> names;
  for (const auto& r : train_rows) {
    if (!r.problem.empty()) continue;
    if (first == nullptr) first = &r;
    // Indices and names mixed: which the integers are is a guess; the recipe must say.
    TRAINER_CHECK_T(UsageError, r.label_is_integer == first->label_is_integer, train_path, " line ", r.line,
                    ": the label '", shown(r.label), "' is ", r.label_is_integer ? "a class index" : "a name",
                    " where line ", first->line, "'s '", shown(first->label), "' is ",
                    first->label_is_integer ? "a class index" : "a name",
                    "; give the class names in order in dataset.labels");
    all_integers = all_integers && r.label_is_integer;
    if (r.label_is_integer) {
      std::uint64_t v = 0;
      const auto parsed = std::from_chars(r.label.data(), r.label.data() + r.label.size(), v);
      if (parsed.ec != std::errc()) v = ~std::uint64_t{0};  // beyond 64 bits: beyond any limit
      if (largest == nullptr || v > most) {
        largest = &r;
        most = v;
      }
    }
    ++rows;
    names.push_back(r.label);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  if (all_integers && !names.empty()) {
    const std::int64_t limit = class_index_limit(rows);
    TRAINER_CHECK_T(UsageError, most < static_cast<std::uint64_t>(limit), train_path, " line ", largest->line,
                    ": the label ", shown(largest->label), " is not a class index ", rows,
                    " rows can mean (without dataset.labels, class indices are below max(rows, ", kClassIndexFloor,
                    ") = ", limit, "); name the classes in order in dataset.labels");
    c.indices = true;
    c.count = static_cast<std::int64_t>(most) + 1;
    c.described = fmt::format("class indices 0 to {} (the training split's largest)", most);
  } else {
    for (std::size_t i = 0; i < names.size(); ++i) c.by_name[names[i]] = static_cast<std::int64_t>(i);
    c.count = static_cast<std::int64_t>(names.size());
    c.described = "the training split's: " + shown(fmt::format("{}", fmt::join(names, ", ")));
  }
  return c;
}

class TextDataset : public Dataset {
 public:
  TextDataset(std::vector<std::int32_t> ids, std::vector<std::uint8_t> types, std::vector<std::uint8_t> special,
              std::vector<std::int64_t> offsets, std::vector<std::int64_t> labels, std::int64_t classes,
              std::int64_t pad, std::int64_t id_limit, std::int64_t longest, std::int64_t pad_to,
              std::optional<Masking> masking)
      : ids_(std::move(ids)),
        types_(std::move(types)),
        special_(std::move(special)),
        offsets_(std::move(offsets)),
        labels_(std::move(labels)),
        classes_(classes),
        pad_(pad),
        id_limit_(id_limit),
        longest_(longest),
        pad_to_(pad_to),
        masking_(masking) {}

  std::int64_t size() const override { return static_cast<std::int64_t>(labels_.size()); }

  Batch get(const at::Tensor& indices) const override { return read(indices, kEvalMasks); }
  Batch get_in_epoch(const at::Tensor& indices, std::int64_t epoch) const override {
    return read(indices, static_cast<std::uint64_t>(epoch));
  }

  DataSpec spec() const override {
    DataSpec d;
    d.sample_shape = {3, pad_to_ > 0 ? pad_to_ : longest_};
    d.num_classes = classes_;
    d.token_id_limit = id_limit_;
    d.pad_token_id = pad_;
    d.token_outputs = masking_.has_value();  // the targets are the hidden tokens [N, L]
    return d;
  }

  at::Tensor lengths() const override {
    at::Tensor out = at::empty({size()}, at::kLong);
    std::int64_t* l = out.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < size(); ++i) l[i] = length(i);
    return out;
  }

  std::int64_t length(std::int64_t i) const {
    return offsets_[static_cast<std::size_t>(i) + 1] - offsets_[static_cast<std::size_t>(i)];
  }

 private:
  /// The samples at `indices`, padded to the longest (or to pad_to_); with masking, the masks of
  /// `epoch`.
  Batch read(const at::Tensor& indices, std::uint64_t epoch) const {
    const auto idx = indices.to(at::kLong).contiguous();
    const auto* ix = idx.data_ptr<std::int64_t>();
    const std::int64_t n = idx.numel();
    std::int64_t width = pad_to_;
    for (std::int64_t k = 0; k < n; ++k) {
      TRAINER_CHECK(ix[k] >= 0 && ix[k] < size(), "text dataset: sample ", ix[k], " of ", size());
      width = std::max(width, length(ix[k]));
    }
    at::Tensor inputs = at::zeros({n, 3, width}, at::kLong);
    at::Tensor targets = masking_ ? at::full({n, width}, -100, at::kLong) : at::empty({n}, at::kLong);
    auto in = inputs.accessor<std::int64_t, 3>();
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t from = offsets_[static_cast<std::size_t>(ix[k])], len = length(ix[k]);
      for (std::int64_t t = 0; t < width; ++t) {
        const bool token = t < len;
        in[k][0][t] = token ? ids_[static_cast<std::size_t>(from + t)] : pad_;
        in[k][1][t] = token ? 1 : 0;
        in[k][2][t] = token ? types_[static_cast<std::size_t>(from + t)] : 0;
      }
      if (!masking_) targets.data_ptr<std::int64_t>()[k] = labels_[static_cast<std::size_t>(ix[k])];
    }
    if (masking_) mask(inputs, targets, ix, epoch);
    return {inputs, targets};
  }

  /// BERT's rule (text_masking.h) over each sample, from the sample's stream of `epoch`.
  void mask(at::Tensor& inputs, at::Tensor& targets, const std::int64_t* ix, std::uint64_t epoch) const {
    const std::int64_t width = inputs.size(2);
    for (std::int64_t k = 0; k < inputs.size(0); ++k) {
      const auto from = static_cast<std::size_t>(offsets_[static_cast<std::size_t>(ix[k])]);
      mask_tokens(*masking_, mask_stream(masking_->seed, epoch, static_cast<std::uint64_t>(ix[k])),
                  inputs.data_ptr<std::int64_t>() + k * 3 * width, special_.data() + from, length(ix[k]),
                  targets.data_ptr<std::int64_t>() + k * width);
    }
  }

  std::vector<std::int32_t> ids_;
  std::vector<std::uint8_t> types_;
  std::vector<std::uint8_t> special_;  ///< with masking: 1 where the tokenizer added a special token
  std::vector<std::int64_t> offsets_;  ///< sample i's tokens: [offsets_[i], offsets_[i + 1])
  std::vector<std::int64_t> labels_;   ///< 0 each with masking
  std::int64_t classes_, pad_, id_limit_, longest_;
  std::int64_t pad_to_;  ///< padding = "max_length": every batch this wide; 0: to its longest sample
  std::optional<Masking> masking_;
};

std::shared_ptr<Dataset> text_dataset(const TextSettings& s, Split split) {
  const auto split_path = split_file(split, s.train, s.test, "file");
  const std::string &key = split_path.first, &path = split_path.second;
  const std::string where = key + " = \"" + path + "\"";
  const text::Tokenizer tok = [&] {
    try {
      return text::Tokenizer::from_path(s.tokenizer);
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("dataset.tokenizer: {}", e.what()));  // the message names the path
    }
  }();
  const std::string& tok_file = tok.file();
  const auto pad = tok.pad_id();
  TRAINER_CHECK_T(UsageError, pad.has_value(), tok_file,
                  ": no padding token ([PAD], <pad> or padding.pad_id), which padding a batch to its longest sample "
                  "needs");
  const std::int64_t room = tok.special_tokens_added(!s.text_pair.empty());
  TRAINER_CHECK_T(UsageError, s.max_length > room, "dataset.max_length = ", s.max_length,
                  " leaves no room for text beside the ", room, " special tokens ", tok_file, " adds");

  std::optional<Masking> masking;
  if (s.masked_lm) {
    const auto mask = tok.mask_id();
    TRAINER_CHECK_T(UsageError, mask.has_value(), tok_file,
                    ": no mask token ([MASK] or <mask>), which dataset.masked_lm = true puts in place of the tokens "
                    "it hides");
    TRAINER_CHECK_T(UsageError, s.labels.empty(), "dataset.labels names classes; dataset.masked_lm = true has none");
    masking = Masking{s.mlm_probability, static_cast<std::uint64_t>(s.seed), *mask, tok.id_limit()};
  }
  std::vector<Row> rows = read_rows(s, path, key);
  Classes classes;
  if (!s.masked_lm) {
    classes = classes_of(s, split == Split::Train ? rows : read_rows(s, s.train, "dataset.train"), s.train);
    TRAINER_CHECK_T(UsageError, classes.count >= 1, "dataset.train = \"", s.train, "\": no labelled rows");
  }

  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> types, special;
  std::vector<std::int64_t> offsets{0}, labels;
  std::int64_t skipped = 0, longest = 0, cut = 0;
  std::string first_skipped;
  std::size_t seen = 0;
  for (auto& r : rows) {
    // Tokenizing a large corpus takes a while: Ctrl-C is answered every few thousand rows.
    if (seen++ % 2048 == 0) throw_if_interrupted("tokenizing the text dataset");
    if (r.problem.empty()) r.problem = text_problem(r.text, s.text);
    if (r.problem.empty() && !s.text_pair.empty()) r.problem = text_problem(r.pair, s.text_pair);
    std::optional<std::int64_t> label;
    if (s.masked_lm) {
      label = 0;
    } else if (r.problem.empty()) {
      label = classes.of(r);
      if (!label) r.problem = fmt::format("the label '{}' is not a class ({})", shown(r.label), classes.described);
    }
    if (!r.problem.empty()) {
      TRAINER_CHECK_T(UsageError, s.bad_rows == "skip", path, " line ", r.line, ": ", r.problem,
                      " (dataset.bad_rows = \"skip\" leaves such rows out)");
      if (skipped++ < 3)
        first_skipped += fmt::format("{}line {}: {}", first_skipped.empty() ? "" : "; ", r.line, r.problem);
      continue;
    }
    const text::Encoding e =
        s.text_pair.empty() ? tok.encode(r.text, std::nullopt, s.max_length) : tok.encode(r.text, r.pair, s.max_length);
    if (e.ids.empty()) {
      // Only whitespace or characters the tokenizer drops, and no special tokens to add.
      TRAINER_CHECK_T(UsageError, s.bad_rows == "skip", path, " line ", r.line,
                      ": the tokenizer gives no tokens for it (dataset.bad_rows = \"skip\" leaves such rows out)");
      if (skipped++ < 3)
        first_skipped += fmt::format("{}line {}: no tokens", first_skipped.empty() ? "" : "; ", r.line);
      continue;
    }
    for (std::size_t k = 0; k < e.ids.size(); ++k) {
      ids.push_back(static_cast<std::int32_t>(e.ids[k]));
      types.push_back(static_cast<std::uint8_t>(std::min<std::int64_t>(e.type_ids[k], 255)));
      if (masking) special.push_back(e.special_mask[k]);
    }
    offsets.push_back(static_cast<std::int64_t>(ids.size()));
    longest = std::max(longest, static_cast<std::int64_t>(e.ids.size()));
    cut += e.truncated > 0 ? 1 : 0;
    labels.push_back(*label);
  }
  if (skipped > 0) {
    default_logger()->warn("dataset text: {}: {} bad row{} left out (dataset.bad_rows = \"skip\"): {}{}", where,
                           skipped, skipped == 1 ? "" : "s", first_skipped, skipped > 3 ? "; ..." : "");
  }
  TRAINER_CHECK_T(UsageError, !labels.empty(), where, ": no rows", skipped > 0 ? " left after the bad ones" : "");
  std::string masked;
  if (masking) {
    const auto chosen = std::count(special.begin(), special.end(), std::uint8_t{0});
    masked = fmt::format("; masked language modelling: {:g} % of the {} tokens that are not special hidden{}",
                         100 * s.mlm_probability, chosen,
                         split == Split::Test ? " (drawn once)" : ", drawn anew each epoch");
  }
  // The lengths, which decide the memory of a step: the longest of a batch is its width.
  std::vector<std::int64_t> lengths(labels.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) lengths[i] = offsets[i + 1] - offsets[i];
  std::sort(lengths.begin(), lengths.end());
  default_logger()->info(
      "dataset text: {}: {} samples, {} tokens, {} classes; lengths {} to {} (median {}, 99th percentile {}); {} cut "
      "to max_length {}{}{}",
      where, labels.size(), ids.size(), classes.count, lengths.front(), lengths.back(), lengths[lengths.size() / 2],
      lengths[std::min(lengths.size() - 1, lengths.size() * 99 / 100)], cut, s.max_length, masked,
      s.padding == "max_length" ? "; every batch padded to max_length" : "");
  return std::make_shared<TextDataset>(std::move(ids), std::move(types), std::move(special), std::move(offsets),
                                       std::move(labels), classes.count, *pad, tok.id_limit(), longest,
                                       s.padding == "max_length" ? s.max_length : 0, masking);
}

}  // namespace

void add_text_dataset(Registry<DatasetFactory>& r) {
  r.add(
      "text",
      [](const Config& c, Split split) -> std::shared_ptr<Dataset> {
        return text_dataset(TextSettings::from(c), split);
      },
      TextSettings::keys(),
      "Texts (or pairs) with class labels in CSV, TSV or JSON Lines, tokenized with a tokenizer.json; batches padded "
      "to their longest (or to max_length); or texts whose tokens BERT's masking hides (masked_lm)");
}

}  // namespace trainer::detail
