// The out-of-memory phases are one table (core/src/train/oom_phase.h); docs/events.md and
// docs/memory.md list them, and must list exactly its rows, with its micro-batch rule.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>

#include "support/test_util.h"
#include "train/oom_phase.h"

namespace trainer {
namespace {

std::set<std::string> table_names(bool only_where_micro_batch_does_not_help = false) {
  std::set<std::string> out;
  for (const auto& row : kOomPhaseTable) {
    if (!only_where_micro_batch_does_not_help || !row.micro_batch_helps) out.insert(row.name);
  }
  return out;
}

/// The `names` in backticks on `line`.
std::set<std::string> quoted(const std::string& line) {
  std::set<std::string> out;
  const std::regex word("`([a-z_]+)`");
  for (std::sregex_iterator it(line.begin(), line.end(), word), end; it != end; ++it) out.insert((*it)[1]);
  return out;
}

/// The first line of `file` that starts with `prefix`.
std::string line_of(const std::string& file, const std::string& prefix) {
  for (const auto& line : testing::read_lines(std::string(TRAINER_SOURCE_DIR) + "/docs/" + file)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  ADD_FAILURE() << "docs/" << file << " has no line starting with " << prefix;
  return "";
}

TEST(OomPhaseTable, DocsEventsMdNamesEveryPhaseAndItsMicroBatchRule) {
  auto field = quoted(line_of("events.md", "| `phase` | "));
  field.erase("phase");  // the row's first cell
  EXPECT_EQ(field, table_names()) << "OomInfo's phase field";
  // "| `micro_batch_helps` | ... `false` for `data`, ... and `checkpoint` (see ...)"
  const std::string helps = line_of("events.md", "| `micro_batch_helps` | ");
  const std::string falses = helps.substr(helps.find("`false` for"), helps.find("(see") - helps.find("`false` for"));
  auto names = quoted(falses);
  names.erase("false");
  EXPECT_EQ(names, table_names(true)) << helps;
}

TEST(OomPhaseTable, DocsMemoryMdHasARowPerPhase) {
  std::set<std::string> rows;
  bool in_table = false;
  for (const auto& line : testing::read_lines(std::string(TRAINER_SOURCE_DIR) + "/docs/memory.md")) {
    if (line.rfind("| phase | what was running |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (in_table && line.rfind("|", 0) != 0) break;
    std::smatch m;
    if (in_table && std::regex_search(line, m, std::regex("^\\| `([a-z_]+)` \\|"))) rows.insert(m[1]);
  }
  EXPECT_EQ(rows, table_names());
}

TEST(OomPhaseTable, WireCodesAreDistinctAndOnlyForTheTrainingStep) {
  std::set<std::int64_t> codes;
  for (const auto& row : kOomPhaseTable) {
    const bool in_step = row.phase != OomPhase::Eval && row.phase != OomPhase::Checkpoint;
    EXPECT_EQ(row.wire_code > 0, in_step) << row.name;
    if (row.wire_code > 0) {
      EXPECT_TRUE(codes.insert(row.wire_code).second) << row.name;
    }
  }
}

}  // namespace
}  // namespace trainer
