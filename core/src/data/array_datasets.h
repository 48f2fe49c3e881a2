#pragma once
// Private: the datasets of numbers in files: "csv" (CSV/TSV, csv_dataset.cpp), "npy" and "npz"
// (NumPy's arrays and archives, numpy_datasets.cpp), and what they share (array_datasets.cpp).
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/data.h"

namespace trainer {

/// Adds the array datasets to the dataset registry `r`.
void add_array_datasets(Registry<DatasetFactory>& r);

namespace detail {

void add_csv_dataset(Registry<DatasetFactory>& r);
void add_numpy_datasets(Registry<DatasetFactory>& r);

/// The whole file; UsageError naming `key` and the file when it cannot be read.
std::string read_whole(const std::string& path, const std::string& key);

/// The records of a CSV or TSV text (RFC 4180: a field in double quotes may hold the delimiter,
/// line breaks and "" for a quote), each with the line it starts on; a UTF-8 byte order mark,
/// "\r\n" line ends and blank lines are taken. UsageError naming `where` and the line for a
/// quoted field still open at the end.
std::vector<std::pair<std::int64_t, std::vector<std::string>>> csv_records(const std::string& text, char delim,
                                                                           const std::string& where);

/// `s` without leading and trailing blanks (spaces, tabs, carriage returns).
std::string trimmed(const std::string& s);

/// The key and the file of a dataset whose splits are one file each (`train`, `test`):
/// UsageError for an empty test file, which a run that evaluates needs (`what`: "file",
/// "archive").
std::pair<std::string, std::string> split_file(Split split, const std::string& train, const std::string& test,
                                               const std::string& what);

/// Targets as a dataset keeps them: integers as int64, booleans (0/1 labels) and floats as
/// float32.
at::Tensor as_targets(const at::Tensor& t);

/// Class indices a split of `samples` samples can mean when no key gives the classes: below
/// max(samples, kClassIndexFloor). A split shows at most one class per sample; the floor lets a
/// small sample of many classes (ImageNet's 1,000) through. An index beyond it would size a
/// model's head from one number in a file (400000000: 12 GiB).
constexpr std::int64_t kClassIndexFloor = 1024;
/// Whole numbers from here on are past what a double holds exactly (2^53 is about 9.007e15): a
/// CSV reads them as values, not as class indices or counts.
constexpr double kExactWholeLimit = 9.0e15;
inline std::int64_t class_index_limit(std::int64_t samples) { return std::max(samples, kClassIndexFloor); }

/// Where a split's targets are, for messages: `what` names the key and the file; sample i is on
/// line lines[i] (a CSV's rows), or, without lines, element i of an array.
struct TargetsSource {
  std::string what;
  std::vector<std::int64_t> lines;
  std::string at(std::int64_t i) const;
};

/// The samples `inputs` [N, ...] (any numeric type: converted to float32 per batch) with
/// `targets` [N] or [N, K] (as_targets' types), held in memory. UsageError, naming
/// `inputs_what` and the targets' source, unless their shapes fit. Integer targets of one column
/// are classes: `configured_classes` (every target below it), else the largest plus one when it
/// is below class_index_limit(N); targets that cannot be class indices (several columns, floats,
/// negative numbers) declare none. Whole numbers from 0 that are too large to be class indices
/// declare none either, and the spec's `classes_refused` names the largest (its line or index).
std::shared_ptr<Dataset> array_dataset(const at::Tensor& inputs, const at::Tensor& targets,
                                       std::int64_t configured_classes, const std::string& inputs_what,
                                       const TargetsSource& targets_source);

}  // namespace detail

}  // namespace trainer
