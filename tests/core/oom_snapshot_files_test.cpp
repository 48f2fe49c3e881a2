// The files of an out-of-memory snapshot in RUN_DIR/memory: the JSON and its pickle, and on
// CUDA the caching allocator's own snapshot beside them (<name>.allocator.pickle), kept,
// replaced and pruned together.
#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <string>

#include "support/test_util.h"
#include "train/memory_timeline.h"
#include "trainer/memory_snapshot.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::write_file;

MemorySnapshot snapshot_at(std::int64_t step) {
  MemorySnapshot s;
  s.device = "cuda:0";
  s.reason = "CUDA out of memory";
  s.step = step;
  s.epoch = 0;
  s.micro_batch = 64;
  s.attempt = 0;
  s.phase = "backward";
  s.requested = 12845056;
  s.live.bytes[static_cast<std::size_t>(MemoryCategory::Parameters)] = 1024;
  s.live.allocated = 1024;
  s.blocks.push_back({0x7f0000000000, 1024, 1, MemoryCategory::Parameters, ""});
  return s;
}

TEST(OomSnapshotFiles, TheAllocatorsSnapshotGoesBesideItsJsonAndIsPrunedWithIt) {
  testing::TempDir dir;
  spdlog::logger log("test", std::make_shared<spdlog::sinks::null_sink_mt>());
  const std::string pickled("\x80\x02}q\x00.", 6);  // a NUL inside: written whole
  const std::string first = write_oom_snapshot(snapshot_at(1), dir.str(), 0, 1, log, pickled);
  EXPECT_EQ(first, "memory/oom-00000001-backward-01.json");
  const std::string base = dir / "memory/oom-00000001-backward-01";
  EXPECT_EQ(read_file(base + ".allocator.pickle"), pickled);
  EXPECT_TRUE(fs::exists(base + ".pickle"));
  // Only the newest is kept: the older one's three files go together.
  write_oom_snapshot(snapshot_at(2), dir.str(), 0, 1, log, "\x80\x02}.");
  EXPECT_FALSE(fs::exists(base + ".json"));
  EXPECT_FALSE(fs::exists(base + ".pickle"));
  EXPECT_FALSE(fs::exists(base + ".allocator.pickle"));
  EXPECT_TRUE(fs::exists(dir / "memory/oom-00000002-backward-01.allocator.pickle"));
}

TEST(OomSnapshotFiles, ASnapshotWithoutTheAllocatorsRemovesAnOlderOneUnderItsName) {
  // A resumed run that fails at the same step, phase and attempt as an earlier process: the
  // earlier allocator snapshot is not this one's.
  testing::TempDir dir;
  spdlog::logger log("test", std::make_shared<spdlog::sinks::null_sink_mt>());
  fs::create_directories(dir / "memory");
  write_file(dir / "memory/oom-00000003-backward-01.allocator.pickle", "an earlier process's");
  EXPECT_EQ(write_oom_snapshot(snapshot_at(3), dir.str(), 0, 5, log), "memory/oom-00000003-backward-01.json");
  EXPECT_FALSE(fs::exists(dir / "memory/oom-00000003-backward-01.allocator.pickle"));
  EXPECT_TRUE(fs::exists(dir / "memory/oom-00000003-backward-01.pickle"));
}

}  // namespace
}  // namespace trainer
