// Durable writes of the files a run keeps (snapshots, status, records): a run directory is
// untrusted input, so what is found at the temporary's name or at the file's name never
// redirects the write.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/test_util.h"
#include "trainer/error.h"
#include "util/durable_file.h"

namespace trainer::detail {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::write_file;

TEST(DurableFile, WritesWholeAndLeavesNoTemporary) {
  testing::TempDir dir;
  const std::string path = dir / "status.json";
  write_atomic(path, "one");
  write_atomic(path, "two, longer");
  EXPECT_EQ(read_file(path), "two, longer");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(DurableFile, ALinkPlantedAtTheTemporarysNameIsRemovedNotWrittenThrough) {
  testing::TempDir dir;
  const std::string outside = dir / "outside.txt";
  write_file(outside, "keep me");
  fs::create_directories(dir / "run");
  const std::string path = dir / "run/snapshot.json";
  fs::create_symlink(outside, path + ".tmp");
  write_atomic(path, "the snapshot");
  EXPECT_EQ(read_file(outside), "keep me");
  EXPECT_EQ(read_file(path), "the snapshot");
  EXPECT_FALSE(fs::is_symlink(path));
  EXPECT_FALSE(fs::exists(fs::symlink_status(path + ".tmp")));
  // A dangling link there (to a file the write would have created elsewhere) likewise.
  const std::string elsewhere = dir / "created-elsewhere.txt";
  fs::create_symlink(elsewhere, path + ".tmp");
  write_atomic(path, "again");
  EXPECT_FALSE(fs::exists(elsewhere));
  EXPECT_EQ(read_file(path), "again");
}

TEST(DurableFile, ALinkAtTheFilesNameIsReplacedNotFollowed) {
  testing::TempDir dir;
  const std::string outside = dir / "outside.txt";
  write_file(outside, "keep me");
  const std::string path = dir / "status.json";
  fs::create_symlink(outside, path);
  write_atomic(path, "status");
  EXPECT_EQ(read_file(outside), "keep me");
  EXPECT_FALSE(fs::is_symlink(path));
  EXPECT_EQ(read_file(path), "status");
}

TEST(DurableFile, AStaleTemporaryIsReplacedAndAMissingDirectoryIsAnErrorNamingTheFile) {
  testing::TempDir dir;
  const std::string path = dir / "records.json";
  write_file(path + ".tmp", "a crashed write's leftover, longer than what comes now");
  write_atomic(path, "new");
  EXPECT_EQ(read_file(path), "new");
  try {
    write_atomic(dir / "missing/x.json", "x");
    ADD_FAILURE() << "wrote into a directory that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.json.tmp"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trainer::detail
