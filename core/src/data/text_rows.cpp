// The rows of the dataset "text"'s files: CSV/TSV as Python's csv module writes them, and JSON
// Lines as datasets' to_json writes them; what is wrong with a row, named by file and line.
#include "data/text_rows.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/array_datasets.h"
#include "text/unicode.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/json.h"

namespace trainer::detail::text_data {

namespace fs = std::filesystem;

std::string shown(const std::string& s) { return s.size() > 40 ? s.substr(0, 40) + "..." : s; }

/// A problem with a text field, or "" when it is fine.
std::string text_problem(const std::string& value, const std::string& column) {
  const auto bad = text::invalid_utf8_at(value);
  if (bad != std::string::npos) return fmt::format("column '{}' is not valid UTF-8 (at byte {})", column, bad);
  if (trimmed(value).empty()) return fmt::format("column '{}' is empty", column);
  return "";
}

namespace {

bool is_index(const std::string& s) {
  return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<Row> read_csv_rows(const std::string& text, char delim, const TextSettings& s, const std::string& where) {
  auto records = csv_records(text, delim, where);
  TRAINER_CHECK_T(UsageError, !records.empty(), where, ": empty (a header naming the columns comes first)");
  std::vector<std::string> columns;
  for (const auto& f : records.front().second) columns.push_back(trimmed(f));
  const auto index_of = [&](const std::string& name, const char* key) -> std::int64_t {
    const auto it = std::find(columns.begin(), columns.end(), name);
    TRAINER_CHECK_T(UsageError, it != columns.end(), "dataset.", key, " = \"", name, "\": no such column in ", where,
                    "; its header names ", fmt::format("{}", fmt::join(columns, ", ")),
                    delim == ',' && columns.size() == 1 ? " (one column: is it a TSV file? dataset.format)" : "");
    return it - columns.begin();
  };
  const std::int64_t t = index_of(s.text, "text"), l = s.masked_lm ? -1 : index_of(s.label, "label");
  const std::int64_t p = s.text_pair.empty() ? -1 : index_of(s.text_pair, "text_pair");
  std::vector<Row> rows;
  rows.reserve(records.size() - 1);
  for (std::size_t r = 1; r < records.size(); ++r) {
    auto& [line, fields] = records[r];
    Row row;
    row.line = line;
    if (fields.size() != columns.size()) {
      row.problem = fmt::format("{} fields; the header has {}", fields.size(), columns.size());
    } else {
      row.text = std::move(fields[static_cast<std::size_t>(t)]);
      if (p >= 0) row.pair = std::move(fields[static_cast<std::size_t>(p)]);
      if (l >= 0) {
        row.label = trimmed(fields[static_cast<std::size_t>(l)]);
        row.label_is_integer = is_index(row.label);
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<Row> read_jsonl_rows(const std::string& text, const TextSettings& s) {
  std::vector<Row> rows;
  std::int64_t line_no = 0;
  for (std::size_t at = 0; at < text.size();) {
    if (line_no % 4096 == 0) throw_if_interrupted("reading the text dataset");  // Ctrl-C in a large file
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (line_no == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    if (trimmed(line).empty()) continue;
    Row row;
    row.line = line_no;
    const auto nesting = json_nesting(line);
    nlohmann::json j;
    if (nesting > 16) {
      row.problem = "nested deeper than 16 levels";
    } else {
      try {
        j = nlohmann::json::parse(line);
        if (!j.is_object()) row.problem = "not a JSON object";
      } catch (const nlohmann::json::parse_error& e) {
        row.problem = fmt::format("not valid JSON (at byte {})", e.byte);
      } catch (const nlohmann::json::exception& e) {
        row.problem = fmt::format("not valid JSON ({})", e.what());  // a number out of range
      }
    }
    if (!row.problem.empty()) {
      rows.push_back(std::move(row));
      continue;
    }
    const auto string_of = [&](const std::string& key, std::string& out) {
      const auto it = j.find(key);
      if (it == j.end()) return fmt::format("no key '{}'", key);
      if (!it->is_string()) return fmt::format("'{}' is {}, not a string", key, shown(it->dump()));
      out = it->get<std::string>();
      return std::string();
    };
    row.problem = string_of(s.text, row.text);
    if (row.problem.empty() && !s.text_pair.empty()) row.problem = string_of(s.text_pair, row.pair);
    if (row.problem.empty() && !s.masked_lm) {
      const auto it = j.find(s.label);
      if (it == j.end()) {
        row.problem = fmt::format("no key '{}'", s.label);
      } else if (it->is_number_unsigned()) {
        row.label = std::to_string(it->get<std::uint64_t>());
        row.label_is_integer = true;
      } else if (it->is_string()) {
        row.label = it->get<std::string>();
        row.label_is_integer = is_index(row.label);  // "3" as CSV's 3
      } else {
        row.problem = fmt::format("label '{}' is {}: a class name or index is expected", s.label, shown(it->dump()));
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string format_of(const TextSettings& s, const std::string& path) {
  if (s.format != "auto") return s.format;
  const auto ext = fs::path(path).extension().string();
  if (ext == ".tsv") return "tsv";
  if (ext == ".jsonl" || ext == ".json") return "jsonl";
  return "csv";
}

}  // namespace

std::vector<Row> read_rows(const TextSettings& s, const std::string& path, const std::string& key) {
  const std::string text = read_whole(path, key);
  const std::string where = key + " = \"" + path + "\"";
  const std::string format = format_of(s, path);
  if (format == "jsonl") return read_jsonl_rows(text, s);
  return read_csv_rows(text, format == "tsv" ? '\t' : ',', s, where);
}

/// The class of each label: the configured names, else the training split's.

}  // namespace trainer::detail::text_data
