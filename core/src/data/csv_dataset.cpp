// The dataset "csv": numbers in a CSV or TSV file, feature columns and target columns by name.
// The file is read whole once and checked as it is parsed: a bad row is named with its file,
// line and column.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "data/array_datasets.h"
#include "trainer/error.h"
#include "trainer/settings.h"

namespace trainer::detail {

namespace {

namespace fs = std::filesystem;

struct CsvSettings : Settings<CsvSettings> {
  std::string train;
  std::string test;
  std::vector<std::string> targets;
  std::vector<std::string> features;
  std::string delimiter = "auto";
  bool header = true;
  std::int64_t num_classes = 0;

  static void declare(SettingsSchema<CsvSettings>& s) {
    s.add(&CsvSettings::train, "train", "The training split's file (CSV, or TSV)").required();
    s.add(&CsvSettings::test, "test", "The test split's file; empty = none (then the run must not evaluate)");
    s.add(&CsvSettings::targets, "targets",
          "The target columns, by name (or by 0-based index without a header): one for a class or a value, several "
          "for labels or values per sample")
        .required();
    s.add(&CsvSettings::features, "features", "The feature columns; empty = every column that is not a target");
    s.add(&CsvSettings::delimiter, "delimiter", "auto (tab for a .tsv file, else comma), comma, tab or semicolon")
        .choices({"auto", "comma", "tab", "semicolon"});
    s.add(&CsvSettings::header, "header", "The first line names the columns");
    s.add(&CsvSettings::num_classes, "num_classes",
          "Classes of integer targets; 0 = the largest target of the training split plus one, when it is below "
          "max(rows, 1024)")
        .min(0);
  }
};

/// A CSV file's numbers, row-major, with the column names.
struct Table {
  std::vector<std::string> columns;
  std::vector<double> values;
  std::vector<std::int64_t> lines;  ///< the line each row starts on
  std::int64_t rows = 0;
};

std::string shown_field(const std::string& f) { return f.size() > 40 ? f.substr(0, 40) + "..." : f; }

Table read_csv(const std::string& path, const std::string& key, char delim, bool header) {
  const std::string text = read_whole(path, key);
  Table t;
  std::size_t width = 0;
  for (auto& [line_no, fields] : csv_records(text, delim, path)) {
    const std::string where = fmt::format("{} line {}", path, line_no);
    if (width == 0) {
      width = fields.size();
      if (header) {
        for (const auto& f : fields) t.columns.push_back(trimmed(f));
        continue;
      }
      for (std::size_t c = 0; c < width; ++c) t.columns.push_back(std::to_string(c));
    }
    TRAINER_CHECK_T(UsageError, fields.size() == width, where, ": ", fields.size(), " fields; the ",
                    header ? "header has " : "first row has ", width,
                    delim == ',' ? " (is the delimiter a comma? dataset.delimiter)" : "");
    for (std::size_t c = 0; c < width; ++c) {
      const std::string v = trimmed(fields[c]);
      double d = 0;
      const auto r = std::from_chars(v.data(), v.data() + v.size(), d);
      TRAINER_CHECK_T(UsageError, !v.empty() && r.ec == std::errc() && r.ptr == v.data() + v.size() && std::isfinite(d),
                      where, ", column '", t.columns[c],
                      "': ", v.empty() ? std::string("an empty field") : "'" + shown_field(v) + "'",
                      " is not a finite number (fill or drop missing values first)");
      t.values.push_back(d);
    }
    t.lines.push_back(line_no);
    ++t.rows;
  }
  TRAINER_CHECK_T(UsageError, t.rows > 0, key, " = \"", path, "\": no rows", header ? " after its header" : "");
  return t;
}

/// The columns of `t` named by `names`, as indices; UsageError naming a missing one.
std::vector<std::int64_t> column_indices(const Table& t, const std::vector<std::string>& names, const std::string& key,
                                         const std::string& path) {
  std::vector<std::int64_t> out;
  for (const auto& n : names) {
    const auto it = std::find(t.columns.begin(), t.columns.end(), n);
    TRAINER_CHECK_T(UsageError, it != t.columns.end(), key, ": no column '", n, "' in ", path, "; its columns are ",
                    fmt::format("{}", fmt::join(t.columns, ", ")));
    out.push_back(it - t.columns.begin());
  }
  return out;
}

at::Tensor columns_of(const Table& t, const std::vector<std::int64_t>& cols) {
  const at::Tensor all = at::from_blob(const_cast<double*>(t.values.data()),
                                       {t.rows, static_cast<std::int64_t>(t.columns.size())}, at::kDouble);
  return all.index_select(1, at::tensor(cols, at::kLong)).clone();
}

std::shared_ptr<Dataset> csv_dataset(const CsvSettings& s, Split split) {
  const auto split_path = split_file(split, s.train, s.test, "file");
  const std::string &key = split_path.first, &path = split_path.second;
  char delim = ',';
  if (s.delimiter == "tab" || (s.delimiter == "auto" && fs::path(path).extension() == ".tsv")) delim = '\t';
  if (s.delimiter == "semicolon") delim = ';';
  const Table t = read_csv(path, key, delim, s.header);
  const auto targets = column_indices(t, s.targets, "dataset.targets", path);
  std::vector<std::int64_t> features;
  if (s.features.empty()) {
    for (std::int64_t c = 0; c < static_cast<std::int64_t>(t.columns.size()); ++c) {
      if (std::find(targets.begin(), targets.end(), c) == targets.end()) features.push_back(c);
    }
  } else {
    features = column_indices(t, s.features, "dataset.features", path);
  }
  TRAINER_CHECK_T(UsageError, !features.empty(), path, ": no feature column left besides the targets");
  at::Tensor y = columns_of(t, targets);
  if (targets.size() == 1) y = y.squeeze(1);
  // Whole numbers are class indices or counts (int64); anything else is a value (float32).
  const bool whole = y.eq(y.round()).all().item<bool>() && y.abs().max().item<double>() < kExactWholeLimit;
  y = whole ? y.to(at::kLong) : y.to(at::kFloat);
  const std::string what = key + " = \"" + path + "\"";
  return array_dataset(columns_of(t, features).to(at::kFloat), y, s.num_classes, what, TargetsSource{what, t.lines});
}

}  // namespace

void add_csv_dataset(Registry<DatasetFactory>& r) {
  r.add(
      "csv",
      [](const Config& c, Split split) -> std::shared_ptr<Dataset> { return csv_dataset(CsvSettings::from(c), split); },
      CsvSettings::keys(), "Numbers in a CSV or TSV file: feature columns and target columns by name");
}

}  // namespace trainer::detail
