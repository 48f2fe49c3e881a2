// The datasets "npy" (NumPy's arrays, as numpy.save writes them) and "npz" (their archives,
// numpy.savez and savez_compressed). A file's header is checked against its bytes before the
// tensor is allocated; an archive's records are bounded by the project's zip reader.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "data/array_datasets.h"
#include "model/zip_archive.h"
#include "trainer/error.h"
#include "trainer/settings.h"

namespace trainer::detail {

namespace {

namespace fs = std::filesystem;

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
          "Classes of integer targets; 0 = the largest target of the training split plus one, when it is below "
          "max(samples, 1024)")
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
                  "dataset.test_inputs and dataset.test_targets: the run evaluates (eval.every_epochs, every_steps or "
                  "eval.at_end) "
                  "and needs both; set them or eval.every_epochs = 0");
  return array_dataset(read_npy(inputs_path, inputs_key), as_targets(read_npy(targets_path, targets_key)),
                       s.num_classes, inputs_key + " = \"" + inputs_path + "\"",
                       TargetsSource{targets_key + " = \"" + targets_path + "\"", {}});
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
          "Classes of integer targets; 0 = the largest target of the training split plus one, when it is below "
          "max(samples, 1024)")
        .min(0);
  }
};

std::shared_ptr<Dataset> npz_dataset(const NpzSettings& s, Split split) {
  const auto split_path = split_file(split, s.train, s.test, "archive");
  const std::string &key = split_path.first, &path = split_path.second;
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
  const auto what = [&](const std::string& name) { return fmt::format("{} = \"{}\", array '{}'", key, path, name); };
  return array_dataset(array(s.inputs, "inputs"), as_targets(array(s.targets, "targets")), s.num_classes,
                       what(s.inputs), TargetsSource{what(s.targets), {}});
}

}  // namespace

void add_numpy_datasets(Registry<DatasetFactory>& r) {
  r.add(
      "npy",
      [](const Config& c, Split split) -> std::shared_ptr<Dataset> { return npy_dataset(NpySettings::from(c), split); },
      NpySettings::keys(), "NumPy arrays saved with numpy.save: inputs [N, ...] and targets [N] or [N, K]");
  r.add(
      "npz",
      [](const Config& c, Split split) -> std::shared_ptr<Dataset> { return npz_dataset(NpzSettings::from(c), split); },
      NpzSettings::keys(), "NumPy archives (numpy.savez, savez_compressed) holding inputs and targets per split");
}

}  // namespace trainer::detail
