// Data as users keep it in files of numbers: "csv" (CSV or TSV, feature columns and target
// columns by name), "npy" (NumPy's .npy arrays, as numpy.save writes them) and "npz" (their
// archives, numpy.savez and savez_compressed). Each file is
// read whole into memory once, bounded by its size, and checked as it is read: a bad row is
// named with its file and line, a bad array with its file and what it declares.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "data/array_datasets.h"
#include "model/zip_archive.h"
#include "trainer/error.h"
#include "trainer/settings.h"

namespace trainer {

namespace {

namespace fs = std::filesystem;

/// The whole file; UsageError naming `key` and the file when it cannot be read.
std::string read_whole(const std::string& path, const std::string& key) {
  std::error_code ec;
  TRAINER_CHECK_T(UsageError, fs::is_regular_file(path, ec), key, " = \"", path, "\": no such file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TRAINER_CHECK_T(UsageError, fd >= 0, key, " = \"", path, "\": cannot be opened (", std::strerror(errno), ")");
  struct stat st {};
  ::fstat(fd, &st);
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got = ::read(fd, out.data() + done, out.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += static_cast<std::size_t>(got);
  }
  ::close(fd);
  TRAINER_CHECK_T(UsageError, done == out.size(), key, " = \"", path, "\": read ", done, " of its ", out.size(),
                  " bytes (it changed while being read?)");
  return out;
}

/// Samples held in memory: inputs in the type they were read in (converted to float32 per
/// batch), targets as int64 (integers) or float32.
class ArrayDataset final : public Dataset {
 public:
  ArrayDataset(at::Tensor inputs, at::Tensor targets, std::int64_t classes)
      : inputs_(std::move(inputs)), targets_(std::move(targets)), classes_(classes) {}
  std::int64_t size() const override { return inputs_.size(0); }
  Batch get(const at::Tensor& idx) const override {
    return {inputs_.index_select(0, idx).to(at::kFloat), targets_.index_select(0, idx)};
  }
  DataSpec spec() const override {
    return {std::vector<std::int64_t>(inputs_.sizes().begin() + 1, inputs_.sizes().end()), classes_};
  }

 private:
  at::Tensor inputs_, targets_;
  std::int64_t classes_;
};

/// Targets as a dataset keeps them: integers as int64, booleans (0/1 labels) and floats as
/// float32.
at::Tensor as_targets(const at::Tensor& t) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) return t.to(at::kLong);
  return t.to(at::kFloat);
}

/// The classes of integer targets: `configured` when set (every target must be below it),
/// else the largest target of the split plus one; 0 for targets that cannot be class indices
/// (not integers of one column, or negative: counts or values for a regression).
std::int64_t classes_of(const at::Tensor& targets, std::int64_t configured, const std::string& where) {
  if (targets.scalar_type() != at::kLong || targets.dim() != 1 || targets.numel() == 0) return 0;
  const auto lo = targets.min().item<std::int64_t>(), hi = targets.max().item<std::int64_t>();
  if (lo < 0) return 0;
  if (configured > 0) {
    TRAINER_CHECK_T(UsageError, hi < configured, where, ": a target of ", hi,
                    " with dataset.num_classes = ", configured, "; class indices are below it");
    return configured;
  }
  return hi + 1;
}

// ---------------------------------------------------------------------------------------------
// CSV / TSV

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
          "Classes of integer targets; 0 = the largest target of the training split plus one")
        .min(0);
  }
};

/// A CSV file's numbers, row-major, with the column names.
struct Table {
  std::vector<std::string> columns;
  std::vector<double> values;
  std::int64_t rows = 0;
};

/// Splits one line at `delim`; a field in double quotes may hold the delimiter and "" for a
/// quote. Returns false for a quote left open.
bool split_line(const std::string& line, char delim, std::vector<std::string>& fields) {
  fields.clear();
  std::string f;
  bool quoted = false, was_quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        f += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        f += c;
      }
    } else if (c == '"' && !was_quoted && f.find_first_not_of(" \t") == std::string::npos) {
      quoted = was_quoted = true;
      f.clear();
    } else if (c == delim) {
      fields.push_back(f);
      f.clear();
      was_quoted = false;
    } else {
      f += c;
    }
  }
  fields.push_back(f);
  return !quoted;
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string shown_field(const std::string& f) { return f.size() > 40 ? f.substr(0, 40) + "..." : f; }

Table read_csv(const std::string& path, const std::string& key, char delim, bool header) {
  const std::string text = read_whole(path, key);
  Table t;
  std::vector<std::string> fields;
  std::size_t width = 0;
  std::int64_t line_no = 0;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 byte order mark
    if (trimmed(line).empty()) continue;
    const std::string where = fmt::format("{} line {}", path, line_no);
    TRAINER_CHECK_T(UsageError, split_line(line, delim, fields), where,
                    ": a quoted field is not closed on its line (fields with line breaks are not read)");
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
  const std::string key = split == Split::Train ? "dataset.train" : "dataset.test";
  const std::string path = split == Split::Train ? s.train : s.test;
  TRAINER_CHECK_T(UsageError, !path.empty(),
                  "dataset.test is empty: the run evaluates (eval.every_epochs or "
                  "eval.at_end) and needs a test file; set dataset.test or eval.every_epochs = 0");
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
  const bool whole = y.eq(y.round()).all().item<bool>() && y.abs().max().item<double>() < 9.0e15;
  y = whole ? y.to(at::kLong) : y.to(at::kFloat);
  const std::int64_t classes = classes_of(y, s.num_classes, path);
  return std::make_shared<ArrayDataset>(columns_of(t, features).to(at::kFloat), y, classes);
}

// ---------------------------------------------------------------------------------------------
// .npy

struct NpySettings : Settings<NpySettings> {
  std::string train_inputs, train_targets, test_inputs, test_targets;
  std::int64_t num_classes = 0;

  static void declare(SettingsSchema<NpySettings>& s) {
    s.add(&NpySettings::train_inputs, "train_inputs", "The training inputs: a .npy array [N, ...] (numpy.save)")
        .required();
    s.add(&NpySettings::train_targets, "train_targets",
          "The training targets: a .npy array [N] (classes or values) or [N, K] (labels or values)")
        .required();
    s.add(&NpySettings::test_inputs, "test_inputs", "The test inputs; empty = no test split");
    s.add(&NpySettings::test_targets, "test_targets", "The test targets");
    s.add(&NpySettings::num_classes, "num_classes",
          "Classes of integer targets; 0 = the largest target of the training split plus one")
        .min(0);
  }
};

/// The dtypes a .npy file may hold here, by their descr without the byte order.
const std::map<std::string, std::pair<at::ScalarType, std::size_t>>& npy_types() {
  static const std::map<std::string, std::pair<at::ScalarType, std::size_t>> types = {
      {"f2", {at::kHalf, 2}}, {"f4", {at::kFloat, 4}}, {"f8", {at::kDouble, 8}},
      {"i1", {at::kChar, 1}}, {"i2", {at::kShort, 2}}, {"i4", {at::kInt, 4}},
      {"i8", {at::kLong, 8}}, {"u1", {at::kByte, 1}},  {"b1", {at::kBool, 1}}};
  return types;
}

/// The value of `key` in the header dict ("'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }").
std::string header_value(const std::string& header, const std::string& key, const std::string& where) {
  const std::string quoted = "'" + key + "'";
  const std::size_t k = header.find(quoted);
  TRAINER_CHECK_T(UsageError, k != std::string::npos, where, ": its header has no ", quoted, " (", header, ")");
  std::size_t v = header.find(':', k + quoted.size());
  TRAINER_CHECK_T(UsageError, v != std::string::npos, where, ": a damaged header (", header, ")");
  v = header.find_first_not_of(' ', v + 1);
  if (v == std::string::npos) return {};
  if (header[v] == '(') return header.substr(v, header.find(')', v) - v + 1);
  if (header[v] == '\'') return header.substr(v + 1, header.find('\'', v + 1) - v - 1);
  return header.substr(v, header.find_first_of(",}", v) - v);
}

/// An array numpy.save wrote: format versions 1 to 3, little-endian (or single-byte) numbers,
/// C or Fortran order. Its data must be exactly what its header declares.
at::Tensor parse_npy(const std::string& bytes, const std::string& where) {
  TRAINER_CHECK_T(UsageError, bytes.size() >= 10 && bytes.compare(0, 6, "\x93NUMPY") == 0, where,
                  ": not a .npy file (numpy.save writes one; for an .npz archive use dataset.name = \"npz\")");
  const auto major = static_cast<unsigned char>(bytes[6]);
  TRAINER_CHECK_T(UsageError, major >= 1 && major <= 3, where, ": .npy format version ", int(major),
                  "; versions 1 to 3 are read");
  std::size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | static_cast<std::size_t>(static_cast<unsigned char>(bytes[9]))
                                                            << 8;
    start = 10;
  } else {
    TRAINER_CHECK_T(UsageError, bytes.size() >= 12, where, ": cut short in its header");
    for (int i = 0; i < 4; ++i)
      header_len |= static_cast<std::size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    start = 12;
  }
  TRAINER_CHECK_T(UsageError, header_len <= bytes.size() - start, where, ": its header of ", header_len,
                  " bytes reaches past the file's ", bytes.size());
  const std::string header = bytes.substr(start, header_len);
  const std::string descr = header_value(header, "descr", where);
  const std::string order = header_value(header, "fortran_order", where);
  const std::string shape_text = header_value(header, "shape", where);
  TRAINER_CHECK_T(UsageError, !descr.empty(), where, ": its header names no dtype (", header, ")");
  const char byte_order = descr[0];
  const auto type = npy_types().find(descr.substr(1));
  TRAINER_CHECK_T(UsageError, type != npy_types().end(), where, ": dtype '", descr,
                  "'; read here: float16/32/64, int8/16/32/64, uint8, bool (astype one of them before numpy.save)");
  const std::size_t item = type->second.second;
  TRAINER_CHECK_T(UsageError, byte_order == '<' || byte_order == '|' || (byte_order == '>' && item == 1), where,
                  ": big-endian dtype '", descr, "'; save it little-endian (astype('<", descr.substr(1), "'))");
  TRAINER_CHECK_T(UsageError, order == "False" || order == "True", where, ": fortran_order is '", order, "'");
  std::vector<std::int64_t> shape;
  for (std::size_t i = 1; i < shape_text.size();) {
    const std::size_t j = shape_text.find_first_of(",)", i);
    const std::string d = trimmed(shape_text.substr(i, j - i));
    if (!d.empty()) {
      std::int64_t n = -1;
      const auto r = std::from_chars(d.data(), d.data() + d.size(), n);
      TRAINER_CHECK_T(UsageError, r.ec == std::errc() && r.ptr == d.data() + d.size() && n >= 0, where, ": shape ",
                      shape_text, " is not a tuple of sizes");
      shape.push_back(n);
    }
    if (j == std::string::npos) break;
    i = j + 1;
  }
  TRAINER_CHECK_T(UsageError, !shape.empty(), where, ": a scalar (shape ()), not an array of samples");
  // The data is exactly what the header declares.
  const std::size_t data_at = start + header_len, left = bytes.size() - data_at;
  std::size_t expected = item;
  for (const auto d : shape) {
    TRAINER_CHECK_T(UsageError, !__builtin_mul_overflow(expected, static_cast<std::size_t>(d), &expected), where,
                    ": shape ", shape_text, " of ", descr, " is more bytes than 64 bits count");
  }
  TRAINER_CHECK_T(UsageError, expected == left, where, ": shape ", shape_text, " of ", descr, " is ", expected,
                  " bytes of data; the file has ", left, expected < left ? " (trailing bytes?)" : " (truncated?)");
  std::vector<std::int64_t> stored = shape;
  if (order == "True") std::reverse(stored.begin(), stored.end());
  at::Tensor t = at::empty(stored, at::TensorOptions(type->second.first));
  if (expected > 0) std::memcpy(t.data_ptr(), bytes.data() + data_at, expected);
  if (order == "True") {
    std::vector<std::int64_t> dims(shape.size());
    for (std::size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<std::int64_t>(dims.size() - 1 - i);
    t = t.permute(dims).contiguous();
  }
  return t;
}

at::Tensor read_npy(const std::string& path, const std::string& key) {
  return parse_npy(read_whole(path, key), fmt::format("{} = \"{}\"", key, path));
}

std::shared_ptr<Dataset> npy_dataset(const NpySettings& s, Split split) {
  const bool train = split == Split::Train;
  const std::string inputs_key = train ? "dataset.train_inputs" : "dataset.test_inputs";
  const std::string targets_key = train ? "dataset.train_targets" : "dataset.test_targets";
  const std::string inputs_path = train ? s.train_inputs : s.test_inputs;
  const std::string targets_path = train ? s.train_targets : s.test_targets;
  TRAINER_CHECK_T(UsageError, !inputs_path.empty() && !targets_path.empty(),
                  "dataset.test_inputs and dataset.test_targets: the run evaluates (eval.every_epochs or eval.at_end) "
                  "and needs both; set them or eval.every_epochs = 0");
  const at::Tensor x = read_npy(inputs_path, inputs_key);
  const at::Tensor y = as_targets(read_npy(targets_path, targets_key));
  TRAINER_CHECK_T(UsageError, x.size(0) == y.size(0), inputs_key, " = \"", inputs_path, "\" holds ", x.size(0),
                  " samples, ", targets_key, " = \"", targets_path, "\" ", y.size(0), " targets");
  TRAINER_CHECK_T(UsageError, y.dim() <= 2, targets_key, " = \"", targets_path, "\": ", y.dim(),
                  " dimensions; targets are [N] or [N, K]");
  TRAINER_CHECK_T(UsageError, x.dim() >= 2, inputs_key, " = \"", inputs_path,
                  "\": one dimension; inputs are [N, features] or [N, C, H, W]");
  return std::make_shared<ArrayDataset>(x, y, classes_of(y, s.num_classes, targets_path));
}

// ---------------------------------------------------------------------------------------------
// .npz

struct NpzSettings : Settings<NpzSettings> {
  std::string train, test;
  std::string inputs = "x", targets = "y";
  std::int64_t num_classes = 0;

  static void declare(SettingsSchema<NpzSettings>& s) {
    s.add(&NpzSettings::train, "train", "The training split: an .npz archive (numpy.savez or savez_compressed)")
        .required();
    s.add(&NpzSettings::test, "test", "The test split's archive; empty = none (then the run must not evaluate)");
    s.add(&NpzSettings::inputs, "inputs", "The inputs' array in each archive: [N, ...]");
    s.add(&NpzSettings::targets, "targets", "The targets' array in each archive: [N] or [N, K]");
    s.add(&NpzSettings::num_classes, "num_classes",
          "Classes of integer targets; 0 = the largest target of the training split plus one")
        .min(0);
  }
};

std::shared_ptr<Dataset> npz_dataset(const NpzSettings& s, Split split) {
  const std::string key = split == Split::Train ? "dataset.train" : "dataset.test";
  const std::string path = split == Split::Train ? s.train : s.test;
  TRAINER_CHECK_T(UsageError, !path.empty(),
                  "dataset.test is empty: the run evaluates (eval.every_epochs or "
                  "eval.at_end) and needs a test archive; set dataset.test or eval.every_epochs = 0");
  std::error_code ec;
  TRAINER_CHECK_T(UsageError, fs::is_regular_file(path, ec), key, " = \"", path, "\": no such file");
  std::unique_ptr<detail::ZipArchive> zip;
  // Records are NumPy's .npy files, stored (savez) or deflated (savez_compressed); what the
  // deflated ones declare is bounded by deflate's largest ratio to the file's bytes.
  detail::ZipLayout layout;
  layout.torch = false;
  layout.max_inflated = static_cast<std::uint64_t>(fs::file_size(path, ec)) * detail::kMaxDeflateRatio + (1 << 20);
  try {
    zip = detail::ZipArchive::open(path, layout);
  } catch (const detail::TorchSaveError& e) {
    throw UsageError(fmt::format("{} = \"{}\": {}", key, path, e.what()));
  }
  TRAINER_CHECK_T(UsageError, zip != nullptr, key, " = \"", path,
                  "\": not a zip archive (numpy.savez writes one; for a single array use dataset.name = \"npy\")");
  const auto array = [&](const std::string& name, const std::string& which) {
    const std::string record = name + ".npy";
    TRAINER_CHECK_T(UsageError, zip->has(record), key, " = \"", path, "\": no array '", name, "' (dataset.", which,
                    "); it holds ", fmt::format("{}", fmt::join(zip->names(), ", ")));
    std::string bytes;
    try {
      bytes = zip->read(record);
    } catch (const detail::TorchSaveError& e) {
      throw UsageError(fmt::format("{} = \"{}\": {}", key, path, e.what()));
    }
    return parse_npy(bytes, fmt::format("{} = \"{}\", array '{}'", key, path, name));
  };
  const at::Tensor x = array(s.inputs, "inputs");
  const at::Tensor y = as_targets(array(s.targets, "targets"));
  TRAINER_CHECK_T(UsageError, x.size(0) == y.size(0), key, " = \"", path, "\": '", s.inputs, "' holds ", x.size(0),
                  " samples, '", s.targets, "' ", y.size(0), " targets");
  TRAINER_CHECK_T(UsageError, y.dim() <= 2, key, " = \"", path, "\": '", s.targets, "' has ", y.dim(),
                  " dimensions; targets are [N] or [N, K]");
  TRAINER_CHECK_T(UsageError, x.dim() >= 2, key, " = \"", path, "\": '", s.inputs,
                  "' has one dimension; inputs are [N, features] or [N, C, H, W]");
  return std::make_shared<ArrayDataset>(x, y, classes_of(y, s.num_classes, path));
}

}  // namespace

void add_array_datasets(Registry<DatasetFactory>& r) {
  r.add(
      "csv",
      [](const Config& c, Split split) -> std::shared_ptr<Dataset> { return csv_dataset(CsvSettings::from(c), split); },
      CsvSettings::keys(), "Numbers in a CSV or TSV file: feature columns and target columns by name");
  r.add(
      "npy",
      [](const Config& c, Split split) -> std::shared_ptr<Dataset> { return npy_dataset(NpySettings::from(c), split); },
      NpySettings::keys(), "NumPy arrays saved with numpy.save: inputs [N, ...] and targets [N] or [N, K]");
  r.add(
      "npz",
      [](const Config& c, Split split) -> std::shared_ptr<Dataset> { return npz_dataset(NpzSettings::from(c), split); },
      NpzSettings::keys(), "NumPy archives (numpy.savez, savez_compressed) holding inputs and targets per split");
}

}  // namespace trainer
