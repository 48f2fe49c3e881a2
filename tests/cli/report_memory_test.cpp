// `trainer report`'s memory map: memory.jsonl's steps as a stacked chart by category, with the
// out-of-memory errors and micro-batch changes marked, and the snapshots' largest allocations,
// from files written here as the core writes them (memory_map_test.cpp reads a real run's), and
// from hostile ones.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "report.h"
#include "support/test_util.h"
#include "trainer/memory.h"

namespace {

namespace fs = std::filesystem;
namespace rp = trainer::report;
using trainer::testing::TempDir;

void put(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string step_line(int step, int micro, long long params, long long activations) {
  return "{\"kind\":\"step\",\"step\":" + std::to_string(step) +
         ",\"epoch\":0,\"micro_batch\":" + std::to_string(micro) +
         ",\"start\":{\"parameters\":" + std::to_string(params) +
         ",\"allocated\":1},\"peak\":{\"parameters\":" + std::to_string(params) +
         ",\"activations\":" + std::to_string(activations) +
         ",\"dataset\":1048576,\"allocated\":" + std::to_string(params + activations + 1048576) + "}}\n";
}

/// A snapshot as the core writes it, with `rows` largest allocations and `phase` as given.
std::string snapshot(int rows, const std::string& phase) {
  std::string s =
      "{\n  \"device\": \"cpu\",\n  \"reason\": \"CPU out of memory\",\n  \"step\": 1,\n  \"epoch\": 0,\n"
      "  \"phase\": \"" +
      phase +
      "\",\n  \"micro_batch\": 64,\n  \"attempt\": 0,\n  \"requested\": 2097152,\n"
      "  \"limit\": 10485760,\n  \"allocated\": 9437184,\n  \"largest_category\": \"activations\",\n"
      "  \"categories\": {\"other\":0,\"parameters\":1048576,\"gradients\":0,\"optimizer_state\":0,"
      "\"activations\":7340032,\"batch\":0,\"evaluation\":0,\"dataset\":1048576},\n  \"blocks\": 40,\n"
      "  \"blocks_left_out\": 0,\n  \"largest\": [";
  for (int i = 0; i < rows; ++i) {
    s += std::string(i ? "," : "") + "\n    {\"size\": " + std::to_string(1048576 - i) +
         ", \"category\": \"activations\", \"phase\": \"forward\", \"serial\": " + std::to_string(100 + i) +
         ", \"address\": 1}";
  }
  return s + "\n  ]\n}\n";
}

void write_run(const std::string& dir) {
  put(dir + "/metrics.jsonl", "{\"step\":1,\"name\":\"train/loss\",\"value\":1,\"time\":1795533884}\n");
  put(dir + "/memory.1.jsonl", step_line(1, 64, 2048, 4194304));
  put(dir + "/memory.jsonl",
      step_line(2, 64, 2048, 4194304) +
          "{\"kind\":\"oom\",\"step\":2,\"epoch\":0,\"phase\":\"forward\",\"micro_batch\":64,\"attempt\":0,"
          "\"requested\":2097152,\"live\":{\"activations\":7340032,\"allocated\":7340032},\"peak\":{\"allocated\":1},"
          "\"after\":{\"allocated\":1,\"reserved\":1}}\n" +
          "not json\n" + "{\"kind\":\"step\",\"pad\":\"" + std::string(20000, 'x') + "\"}\n" + std::string(5000, '[') +
          std::string(5000, ']') + "\n" + step_line(3, 32, 2048, 2097152) +
          "{\"kind\":\"step\",\"step\":4,\"ep");  // killed mid-line
  put(dir + "/memory/oom-00000001-forward-01.json", snapshot(12, "forward"));
  put(dir + "/memory/oom-00000002-forward-01.json", "{\"step\": ");  // cut
  put(dir + "/memory/notes.txt", "not a snapshot");
}

TEST(ReportMemory, TheCategoryNamesAreTheCores) {
  for (std::size_t i = 0; i < rp::kMemoryCategoryCount; ++i) {
    EXPECT_STREQ(rp::kMemoryCategoryNames[i], trainer::memory_category_name(static_cast<trainer::MemoryCategory>(i)));
  }
  EXPECT_EQ(rp::kMemoryCategoryCount, trainer::kMemoryCategoryCount);
}

TEST(ReportMemory, ReadsTheTimelineOldestFirstAndTheSnapshots) {
  TempDir tmp;
  write_run(tmp.str());
  const rp::RunData d = rp::read_run(tmp.str());
  ASSERT_EQ(d.memory_steps.size(), 3u);  // memory.1.jsonl's, then memory.jsonl's two
  EXPECT_EQ(d.memory_steps[0].step, 1);
  EXPECT_EQ(d.memory_steps[2].step, 3);
  EXPECT_EQ(d.memory_steps[2].micro_batch, 32);
  EXPECT_EQ(d.memory_steps[2].peak[4], 2097152);  // activations
  EXPECT_EQ(d.memory_steps[2].peak[7], 1048576);  // dataset
  EXPECT_EQ(d.memory_bad_lines, 4u);              // not json, the long line, the deep one, the cut one
  ASSERT_EQ(d.memory_ooms.size(), 1u);
  EXPECT_EQ(d.memory_ooms[0].phase, "forward");
  ASSERT_TRUE(d.memory_ooms[0].live.has_value());
  EXPECT_EQ((*d.memory_ooms[0].live)[4], 7340032);
  ASSERT_EQ(d.snapshots.size(), 1u);
  const auto& s = d.snapshots[0];
  EXPECT_EQ(s.file, "memory/oom-00000001-forward-01.json");
  EXPECT_EQ(s.largest.size(), rp::kSnapshotRows);  // of 12
  EXPECT_EQ(s.largest[0].size, 1048576);
  EXPECT_EQ(s.categories[4], 7340032);
  ASSERT_EQ(d.snapshot_notes.size(), 1u);
  EXPECT_NE(d.snapshot_notes[0].find("oom-00000002-forward-01.json: not a JSON object"), std::string::npos)
      << d.snapshot_notes[0];
}

TEST(ReportMemory, ThePageStacksTheCategoriesAndListsTheLargestAllocations) {
  TempDir tmp;
  write_run(tmp.str());
  put(tmp / "memory/oom-00000003-backward-01.json", snapshot(2, "<b>backward</b>"));
  const std::string html = rp::render_html(rp::read_run(tmp.str()));
  const auto section = html.find("<h2>Memory by category</h2>");
  ASSERT_NE(section, std::string::npos);
  const std::string memory = html.substr(section, html.find("</section>", section) - section);
  // One area per category that held bytes: parameters, activations, dataset.
  std::size_t areas = 0;
  for (auto at = memory.find("<polygon"); at != std::string::npos; at = memory.find("<polygon", at + 1)) ++areas;
  EXPECT_EQ(areas, 3u);
  EXPECT_NE(memory.find("<title>activations</title>"), std::string::npos);
  EXPECT_EQ(memory.find("<title>gradients</title>"), std::string::npos);
  // Step 3's column names each category's own MiB, the top of the stack first.
  EXPECT_NE(memory.find("step 3\ndataset: 1\nactivations: 2\nparameters: 0.001953<"), std::string::npos) << memory;
  EXPECT_NE(memory.find("OOM forward (64)"), std::string::npos);
  EXPECT_NE(memory.find("micro-batch 64 → 32"), std::string::npos);
  // The snapshots: the one readable earlier (ten rows of twelve), the new one with its phase escaped.
  std::size_t rows = 0;
  for (auto at = memory.find("<td>activations</td><td>forward</td>"); at != std::string::npos;
       at = memory.find("<td>activations</td><td>forward</td>", at + 1)) {
    ++rows;
  }
  EXPECT_EQ(rows, rp::kSnapshotRows + 2);
  EXPECT_NE(memory.find("&lt;b&gt;backward&lt;/b&gt;"), std::string::npos);
  EXPECT_EQ(memory.find("<b>backward"), std::string::npos);
  EXPECT_NE(memory.find("not a JSON object"), std::string::npos);
  // Every area's corners lie in its chart.
  const std::regex points("points=\"([^\"]*)\"");
  for (std::sregex_iterator it(memory.begin(), memory.end(), points), end; it != end; ++it) {
    std::istringstream pairs((*it)[1].str());
    double x, y;
    char comma;
    while (pairs >> x >> comma >> y) {
      EXPECT_TRUE(x >= 0 && x <= 1200 && y >= 0 && y <= 380) << x << "," << y;
    }
  }
}

TEST(ReportMemory, LinksAndLargeFilesAreNotRead) {
  TempDir root;
  const fs::path tmp = root / "run", elsewhere = root / "elsewhere", big = root / "big";
  put(tmp / "metrics.jsonl", "");
  put(elsewhere / "memory/oom-00000001-forward-01.json", snapshot(3, "forward"));
  put(elsewhere / "memory.jsonl", step_line(1, 64, 1, 1));
  fs::create_directory_symlink(elsewhere / "memory", tmp / "memory");
  fs::create_symlink(elsewhere / "memory.jsonl", tmp / "memory.jsonl");
  rp::RunData d = rp::read_run(tmp.string());
  EXPECT_TRUE(d.memory_steps.empty());
  EXPECT_TRUE(d.snapshots.empty());
  EXPECT_EQ(rp::render_html(d).find("Memory by category"), std::string::npos);

  put(big / "metrics.jsonl", "");
  put(big / "memory/oom-00000001-forward-01.json", snapshot(3, "forward") + std::string(rp::kMaxSnapshotBytes, ' '));
  fs::create_symlink(elsewhere / "memory/oom-00000001-forward-01.json", big / "memory/oom-00000002-forward-01.json");
  d = rp::read_run(big.string());
  EXPECT_TRUE(d.snapshots.empty());
  ASSERT_EQ(d.snapshot_notes.size(), 2u);
  EXPECT_NE(d.snapshot_notes[0].find("larger than 8 MiB"), std::string::npos) << d.snapshot_notes[0];
  EXPECT_NE(d.snapshot_notes[1].find("not a regular file"), std::string::npos) << d.snapshot_notes[1];
}

}  // namespace
