#pragma once
// Private to the MLflow client: reading and repairing RUN_DIR/mlflow/journal.jsonl.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace trainer::mlflow::detail {

inline constexpr const char* kJournal = "journal.jsonl";
inline constexpr const char* kRejected = "rejected.jsonl";

/// Calls `fn(record, end_offset)` for each complete line of the journal from `offset`; stops
/// early when `fn` returns false. A last line without its newline (a process died writing
/// it) is left for later.
template <class Fn>
void for_each_record(const std::filesystem::path& journal, std::int64_t offset, Fn fn) {
  std::ifstream in(journal, std::ios::binary);
  if (!in) return;
  in.seekg(offset);
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline: incomplete
    offset += static_cast<std::int64_t>(line.size()) + 1;
    if (!fn(line, offset)) return;
  }
}

/// A record's `seq`, or `fallback` when it has none (or not an integer).
inline std::int64_t seq_of(const nlohmann::json& rec, std::int64_t fallback) {
  return rec.is_object() && rec.contains("seq") && rec["seq"].is_number_integer() ? rec["seq"].get<std::int64_t>()
                                                                                  : fallback;
}

/// Cuts a last line without its newline (a process died writing it: never complete, so
/// never sent) so that what is appended next starts a line of its own. Returns the bytes cut.
std::int64_t drop_incomplete_tail(const std::filesystem::path& journal);

}  // namespace trainer::mlflow::detail
