#pragma once
// Private: the rows of the dataset "text"'s files (text_rows.cpp) and its settings
// (text_dataset.cpp reads them).
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/settings.h"

namespace trainer::detail::text_data {

struct TextSettings : Settings<TextSettings> {
  std::string train;
  std::string test;
  std::string tokenizer;
  std::string format = "auto";
  std::string text = "text";
  std::string text_pair;
  std::string label = "label";
  std::vector<std::string> labels;
  std::int64_t max_length = 512;
  std::string padding = "longest";
  std::string bad_rows = "error";
  bool masked_lm = false;
  double mlm_probability = 0.15;
  std::int64_t seed = 0;

  static void declare(SettingsSchema<TextSettings>& s) {
    s.add(&TextSettings::train, "train", "The training split's file: CSV, TSV or JSON Lines").required();
    s.add(&TextSettings::test, "test", "The test split's file; empty = none (then the run must not evaluate)");
    s.add(&TextSettings::tokenizer, "tokenizer",
          "A model directory as save_pretrained writes it (its spiece.model or spm.model with "
          "tokenizer_config.json, else its tokenizer.json), a tokenizer.json, or a SentencePiece .model file")
        .required();
    s.add(&TextSettings::format, "format", "auto (by extension: .tsv, .jsonl or .json, else CSV), csv, tsv or jsonl")
        .choices({"auto", "csv", "tsv", "jsonl"});
    s.add(&TextSettings::text, "text", "The column (JSON Lines: the key) of the text");
    s.add(&TextSettings::text_pair, "text_pair",
          "The column of a second text per sample (sentence pairs); empty = none");
    s.add(&TextSettings::label, "label", "The column of the label: a class name, or a class index");
    s.add(&TextSettings::labels, "labels",
          "The class names in index order; empty = from the training split: its integer labels as indices, or its "
          "names sorted");
    s.add(&TextSettings::max_length, "max_length",
          "Tokens per sample at most, special tokens included: longer texts are cut (the longer of a pair first, "
          "as transformers' truncation=True)")
        .min(1)
        .max(1 << 20);
    s.add(&TextSettings::padding, "padding",
          "longest: each batch padded to its longest sample (dynamic padding); max_length: every batch padded to "
          "max_length (transformers' padding=\"max_length\"): one shape for every step (model bert computes over "
          "it with model.trim_padding = false)")
        .choices({"longest", "max_length"});
    s.add(&TextSettings::bad_rows, "bad_rows",
          "A row without its columns, with an empty text, text that is not UTF-8 or an unknown label: error (stop, "
          "naming file and line) or skip (leave it out, counted in the log)")
        .choices({"error", "skip"});
    s.add(&TextSettings::masked_lm, "masked_lm",
          "Masked language modelling (task.name = \"masked_lm\"): no labels; each sample's targets are the tokens "
          "BERT's rule hides (mlm_probability of its tokens other than the special ones: 80 % become the mask "
          "token, 10 % a random token, 10 % stay), drawn anew each epoch from (seed, epoch, sample); the test "
          "split's are drawn once");
    s.add(&TextSettings::mlm_probability, "mlm_probability", "With masked_lm: the share of tokens hidden")
        .min(0, false)
        .max(1, false);
    s.add(&TextSettings::seed, "seed", "With masked_lm: the seed of the masks (with the epoch and the sample's index)")
        .min(0);
  }
};

/// One row of a file: its line and its fields by column, or what is wrong with it.
struct Row {
  std::int64_t line = 0;
  std::string text, pair, label;
  bool label_is_integer = false;
  std::string problem;
};

/// `s` cut to 40 bytes for a message.
std::string shown(const std::string& s);

/// What is wrong with a text of `column` (empty, not UTF-8), or "".
std::string text_problem(const std::string& value, const std::string& column);

/// The rows of the split file `path` (named by its setting, `key`), as `s` says to read it:
/// CSV/TSV with a header, or JSON Lines; a row that cannot be read has its problem set, or is
/// an error naming the file and line.
std::vector<Row> read_rows(const TextSettings& s, const std::string& path, const std::string& key);

}  // namespace trainer::detail::text_data
