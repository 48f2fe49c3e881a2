// The table of which event honours which Control field: the core applies it (see
// control_test.cpp), and docs/events.md prints it; the two must agree.
#include "trainer/events.h"

#include <gtest/gtest.h>

#include <sstream>

#include "support/test_util.h"

namespace trainer {
namespace {

/// The cells of a Markdown table row: "| a | b |" -> {"a", "b"}.
std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::stringstream in(row.substr(1));
  for (std::string cell; std::getline(in, cell, '|');) {
    const auto b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
    out.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
  }
  return out;
}

/// The table as docs/events.md should print it.
std::string expected_table() {
  std::string s = "| event |";
  for (const auto& f : kControlFieldTable) s += " `" + std::string(f.name) + "` |";
  s += "\n";
  for (const auto& e : kEventTable) {
    s += "| `" + std::string(e.name) + "` |";
    for (const auto& f : kControlFieldTable) s += honours(e.event, f.field) ? " ✓ |" : " — |";
    s += "\n";
  }
  s += "| *elsewhere* |";
  for (const auto& f : kControlFieldTable) s += f.warn_when_ignored ? " warning |" : " silent |";
  return s + "\n";
}

TEST(EventTable, DocsEventsMdPrintsTheCoresTable) {
  const auto lines = testing::read_lines(std::string(TRAINER_SOURCE_DIR) + "/docs/events.md");
  auto header = std::find_if(lines.begin(), lines.end(),
                             [](const std::string& l) { return l.rfind("| event | `stop_training`", 0) == 0; });
  ASSERT_NE(header, lines.end()) << "docs/events.md has no Control table; it should read:\n" << expected_table();
  std::string actual;
  for (auto it = header; it != lines.end() && it->rfind("|", 0) == 0; ++it) {
    if (it->rfind("|---", 0) == 0) continue;
    const auto c = cells(*it);
    std::string row = "|";
    for (const auto& x : c) row += " " + x + " |";
    actual += row + "\n";
  }
  EXPECT_EQ(actual, expected_table());
}

TEST(EventTable, RowsFollowTheEnumAndNamesRoundTrip) {
  ASSERT_EQ(kEventTable.size(), kNumEvents);
  for (std::size_t i = 0; i < kNumEvents; ++i) {
    const auto e = static_cast<Event>(i);
    EXPECT_EQ(kEventTable[i].event, e);
    EXPECT_EQ(event_from_name(event_name(e)), e);
  }
  EXPECT_EQ(all_events().size(), kNumEvents);
  EXPECT_FALSE(event_from_name("BatchBegin").has_value());
}

TEST(EventTable, RequestsAreHonouredUntilTheLoopEnds) {
  for (const auto& e : kEventTable) {
    const bool over = e.event == Event::FitEnd || e.event == Event::Exception || e.event == Event::Shutdown;
    // Inside an evaluation a request for another one would only repeat it.
    const bool in_eval =
        e.event == Event::EvalBatchStart || e.event == Event::EvalBatchEnd || e.event == Event::EvalMetrics;
    for (auto f : {ControlField::StopTraining, ControlField::RequestCheckpoint}) {
      EXPECT_EQ(honours(e.event, f), !over) << e.name << " " << control_field_name(f);
    }
    EXPECT_EQ(honours(e.event, ControlField::RequestEval), !over && !in_eval) << e.name;
  }
  EXPECT_TRUE(honours(Event::OutOfMemory, ControlField::RetryWithMicroBatch));
  EXPECT_FALSE(honours(Event::BatchStart, ControlField::RetryWithMicroBatch));
  EXPECT_TRUE(is_closing_event(Event::AfterForward));
  EXPECT_FALSE(is_closing_event(Event::BeforeForward));
}

TEST(ControlFields, HasAndClearCoverEveryField) {
  Control c;
  c.stop_training = c.skip_step = c.request_checkpoint = c.request_eval = true;
  c.retry_with_micro_batch = 4;
  c.micro_batch_size = 8;
  c.switch_device = "cpu";
  c.checkpointed_blocks = 2;
  c.optimizer_moment_bits = 16;
  c.optimizer_offload = false;  // a request either way
  for (const auto& f : kControlFieldTable) {
    EXPECT_TRUE(c.has(f.field)) << f.name;
    c.clear(f.field);
    EXPECT_FALSE(c.has(f.field)) << f.name;
  }
  EXPECT_FALSE(c.any());
}

}  // namespace
}  // namespace trainer
