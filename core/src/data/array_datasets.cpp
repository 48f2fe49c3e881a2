// What the datasets of numbers in files share: reading a file whole, the dataset that holds
// the samples in memory with the checks of their shapes, and the classes of integer targets.
// The formats are csv_dataset.cpp (CSV, TSV) and numpy_datasets.cpp (.npy, .npz).
#include "data/array_datasets.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "trainer/error.h"

namespace trainer {

namespace {

namespace fs = std::filesystem;
using detail::class_index_limit;
using detail::kClassIndexFloor;
using detail::kExactWholeLimit;
using detail::TargetsSource;

/// The classes a split's targets declare; when whole numbers from 0 declare none because one is
/// too large to be a class index, why (DataSpec::classes_refused).
struct Classes {
  std::int64_t count = 0;
  std::string refused;
};

/// Samples held in memory: inputs in the type they were read in (converted to float32 per
/// batch), targets as int64 (integers) or float32.
class ArrayDataset final : public Dataset {
 public:
  ArrayDataset(at::Tensor inputs, at::Tensor targets, Classes classes)
      : inputs_(std::move(inputs)), targets_(std::move(targets)), classes_(std::move(classes)) {}
  std::int64_t size() const override { return inputs_.size(0); }
  Batch get(const at::Tensor& idx) const override {
    return {inputs_.index_select(0, idx).to(at::kFloat), targets_.index_select(0, idx)};
  }
  DataSpec spec() const override {
    DataSpec d;
    d.sample_shape.assign(inputs_.sizes().begin() + 1, inputs_.sizes().end());
    d.num_classes = classes_.count;
    d.classes_refused = classes_.refused;
    return d;
  }

 private:
  at::Tensor inputs_, targets_;
  Classes classes_;
};

/// Float targets that are all whole numbers from 0 but no class indices because one is too
/// large to be held exactly (a CSV reads whole numbers from kExactWholeLimit on as values): why.
std::string too_large_whole(const at::Tensor& targets, const TargetsSource& source) {
  if (!at::isFloatingType(targets.scalar_type())) return {};
  const at::Tensor d = targets.to(at::kDouble);
  if (!d.eq(d.round()).all().item<bool>() || d.min().item<double>() < 0) return {};
  const std::int64_t i = d.argmax().item<std::int64_t>();
  const double largest = d[i].item<double>();
  if (largest < kExactWholeLimit) return {};
  return fmt::format(
      "{}: the target {} is a whole number too large to be a class index (from {:g} on, they are values)", source.at(i),
      largest, kExactWholeLimit);
}

/// The classes of integer targets: `configured` when set (every target must be below it), else
/// the largest target of the split plus one when it is below class_index_limit(); none for
/// targets that cannot be class indices (not integers of one column, or negative: counts or
/// values for a regression). A regression's whole numbers may be as large as they like: a
/// refused count is an error only for a task that needs classes.
Classes classes_of(const at::Tensor& targets, std::int64_t configured, const TargetsSource& source) {
  if (targets.dim() != 1 || targets.numel() == 0) return {};
  if (targets.scalar_type() != at::kLong) return {0, too_large_whole(targets, source)};
  if (targets.min().item<std::int64_t>() < 0) return {};
  const std::int64_t at_largest = targets.argmax().item<std::int64_t>();
  const std::int64_t largest = targets[at_largest].item<std::int64_t>();
  if (configured > 0) {
    TRAINER_CHECK_T(UsageError, largest < configured, source.at(at_largest), ": the target ", largest,
                    " with dataset.num_classes = ", configured, "; class indices are below it");
    return {configured, {}};
  }
  const std::int64_t samples = targets.size(0), limit = class_index_limit(samples);
  if (largest < limit) return {largest + 1, {}};
  return {0, fmt::format("{}: the target {} is not a class index {} samples can mean (without dataset.num_classes, "
                         "class indices are below max(samples, {}) = {}); if there are that many classes, set "
                         "dataset.num_classes",
                         source.at(at_largest), largest, samples, kClassIndexFloor, limit)};
}

}  // namespace

namespace detail {

std::vector<std::pair<std::int64_t, std::vector<std::string>>> csv_records(const std::string& text, char delim,
                                                                           const std::string& where) {
  std::vector<std::pair<std::int64_t, std::vector<std::string>>> out;
  std::vector<std::string> fields;
  std::string field;
  std::int64_t line = 1, start_line = 1;
  bool quoted = false, field_quoted = false, any = false;
  std::size_t i = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;  // a UTF-8 byte order mark
  const auto end_record = [&] {
    fields.push_back(std::move(field));
    field.clear();
    const bool blank = fields.size() == 1 && !field_quoted && trimmed(fields[0]).empty();
    if (!blank) out.emplace_back(start_line, std::move(fields));
    fields.clear();
    field_quoted = false;
    any = false;
  };
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        field += c;
      }
      continue;
    }
    if (!any) {
      start_line = line;
      any = true;
    }
    if (c == '"' && !field_quoted && trimmed(field).empty()) {
      quoted = field_quoted = true;
      field.clear();
    } else if (c == delim) {
      fields.push_back(std::move(field));
      field.clear();
      field_quoted = false;
    } else if (c == '\n') {
      if (!field.empty() && field.back() == '\r') field.pop_back();
      end_record();
      ++line;
    } else {
      field += c;
    }
  }
  TRAINER_CHECK_T(UsageError, !quoted, where, " line ", start_line,
                  ": a quoted field is not closed before the end of the file");
  if (any) {
    if (!field.empty() && field.back() == '\r') field.pop_back();
    end_record();
  }
  return out;
}

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

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::pair<std::string, std::string> split_file(Split split, const std::string& train, const std::string& test,
                                               const std::string& what) {
  if (split == Split::Train) return {"dataset.train", train};
  TRAINER_CHECK_T(UsageError, !test.empty(),
                  "dataset.test is empty: the run evaluates (eval.every_epochs, every_steps or "
                  "eval.at_end) and needs a test ",
                  what, "; set dataset.test or eval.every_epochs = 0");
  return {"dataset.test", test};
}

at::Tensor as_targets(const at::Tensor& t) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) return t.to(at::kLong);
  return t.to(at::kFloat);
}

std::string TargetsSource::at(std::int64_t i) const {
  if (lines.empty()) return fmt::format("{}, element {}", what, i);
  return fmt::format("{} line {}", what, lines[static_cast<std::size_t>(i)]);
}

std::shared_ptr<Dataset> array_dataset(const at::Tensor& inputs, const at::Tensor& targets,
                                       std::int64_t configured_classes, const std::string& inputs_what,
                                       const TargetsSource& targets_source) {
  const std::string& targets_what = targets_source.what;
  TRAINER_CHECK_T(UsageError, inputs.size(0) == targets.size(0), inputs_what, " holds ", inputs.size(0), " samples, ",
                  targets_what, " ", targets.size(0), " targets");
  TRAINER_CHECK_T(UsageError, targets.dim() <= 2, targets_what, ": ", targets.dim(),
                  " dimensions; targets are [N] or [N, K]");
  TRAINER_CHECK_T(UsageError, inputs.dim() >= 2, inputs_what,
                  ": one dimension; inputs are [N, features] or [N, C, H, W]");
  return std::make_shared<ArrayDataset>(inputs, targets, classes_of(targets, configured_classes, targets_source));
}

}  // namespace detail

void add_array_datasets(Registry<DatasetFactory>& r) {
  detail::add_csv_dataset(r);
  detail::add_numpy_datasets(r);
}

}  // namespace trainer
