// Durable writes of the files a run keeps (snapshots, status, records): a run directory is
// untrusted input, so what is found at the temporary's name or at the file's name never
// redirects the write.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <ostream>
#include <stdexcept>
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

/// The message of the trainer::UsageError `f` throws ("" when it throws none).
template <typename F>
std::string usage_error_of(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(DurableFile, AnAppendNeverGoesThroughALinkNorIntoAFifoAndNamesWhatIsThere) {
  testing::TempDir dir;
  const std::string outside = dir / "outside.txt";
  write_file(outside, "keep me");
  const std::string log = dir / "trainer.log";
  fs::create_symlink(outside, log);
  const std::string link = usage_error_of([&] { open_for_append(log); });
  EXPECT_NE(link.find(log + " is a symbolic link"), std::string::npos) << link;
  const std::string dangling = dir / "metrics.jsonl";
  fs::create_symlink(dir / "created-elsewhere", dangling);
  EXPECT_NE(usage_error_of([&] { open_for_update(dangling); }), "");
  EXPECT_FALSE(fs::exists(dir / "created-elsewhere"));
  EXPECT_EQ(read_file(outside), "keep me");
  // A FIFO nobody reads would block the open: refused at once.
  const std::string fifo = dir / "memory.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string refused = usage_error_of([&] { open_for_append(fifo); });
  EXPECT_NE(refused.find(fifo + " is a FIFO"), std::string::npos) << refused;
  // A regular file is appended to; a missing one created.
  const std::string own = dir / "own.jsonl";
  for (const char* line : {"one\n", "two\n"}) {
    const FileDescriptor fd = open_for_append(own);
    write_fully(fd.get(), line, 4, own);
  }
  EXPECT_EQ(read_file(own), "one\ntwo\n");
}

TEST(DurableFile, ANewFileReplacesWhatIsAtItsNameAndAStreamWriteGoesThroughATemporary) {
  testing::TempDir dir;
  const std::string outside = dir / "outside.txt";
  write_file(outside, "keep me");
  const std::string events = dir / "events.jsonl";
  fs::create_symlink(outside, events);
  {
    const FileDescriptor fd = create_new_file(events);
    write_fully(fd.get(), "mine", 4, events);
  }
  EXPECT_FALSE(fs::is_symlink(events));
  EXPECT_EQ(read_file(events), "mine");
  const std::string archive = dir / "adapters.pt";
  fs::create_symlink(outside, archive + ".tmp");
  write_atomic(archive, [](std::ostream& out) { out << std::string(200000, 'x'); });  // past the stream's buffer
  EXPECT_EQ(read_file(archive), std::string(200000, 'x'));
  EXPECT_EQ(read_file(outside), "keep me");
  EXPECT_FALSE(fs::exists(fs::symlink_status(archive + ".tmp")));
  // What the writer throws removes the temporary.
  EXPECT_THROW(write_atomic(archive,
                            [](std::ostream& out) {
                              out << "half";
                              throw std::runtime_error("the writer failed");
                            }),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(archive + ".tmp"));
  EXPECT_EQ(read_file(archive), std::string(200000, 'x'));
}

TEST(DurableFile, ADirectoryAtTheTemporarysNameIsRefusedWithExitCode2NamingIt) {
  testing::TempDir dir;
  const std::string path = dir / "status.json";
  fs::create_directories(path + ".tmp/inside");
  const std::string refused = usage_error_of([&] { write_atomic(path, "status"); });
  EXPECT_NE(refused.find(path + ".tmp is a directory"), std::string::npos) << refused;
  EXPECT_TRUE(fs::is_directory(path + ".tmp/inside"));  // left as it was
  EXPECT_FALSE(fs::exists(path));
  const std::string events = dir / "events.jsonl";
  fs::create_directories(events);
  // A UsageError (trainer ends with exit code 2), not a plain Error.
  const std::string direct = usage_error_of([&] { create_new_file(events); });
  EXPECT_NE(direct.find(events + " is a directory"), std::string::npos) << direct;
  EXPECT_TRUE(fs::is_directory(events));
}

/// Runs `write` (which swaps `<tmp>` for a FIFO while it writes) on a thread: whether it ended
/// within 10 s. When it did not (a FIFO opened by name blocks), the FIFO is opened for writing
/// and closed, so that the blocked reader sees its end and the thread can be joined.
bool ends_despite_a_fifo(const std::string& tmp, const std::function<void()>& write) {
  auto done = std::async(std::launch::async, [&] {
    try {
      write();
    } catch (const std::exception&) {
    }
  });
  if (done.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return true;
  const int w = ::open(tmp.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (w >= 0) ::close(w);
  done.wait();
  return false;
}

/// A writer that writes `text`, then replaces the temporary's name with a FIFO.
std::function<void(std::ostream&)> swapping_writer(const std::string& tmp, const std::string& text) {
  return [tmp, text](std::ostream& out) {
    out << text;
    ASSERT_EQ(::unlink(tmp.c_str()), 0);
    ASSERT_EQ(::mkfifo(tmp.c_str(), 0644), 0);
  };
}

TEST(DurableFile, AFifoSwappedInForTheTemporaryIsNeverOpenedSoItBlocksNothing) {
  testing::TempDir dir;
  const std::string path = dir / "snapshot.json";
  // The flush to the disk goes through the descriptor that wrote the temporary, not its name.
  EXPECT_TRUE(ends_despite_a_fifo(path + ".tmp", [&] { write_atomic(path, swapping_writer(path + ".tmp", "x")); }))
      << "the temporary was opened again by name";
  // A checkpoint's digest is counted as it is written, not read back from the temporary.
  const std::string ckpt = dir / "step_00000001.pt";
  const std::string text(200000, 'c');  // past the stream's buffer
  Temporary written;
  EXPECT_TRUE(ends_despite_a_fifo(ckpt + ".tmp", [&] {
    written = write_temporary_digested(ckpt, swapping_writer(ckpt + ".tmp", text));
  })) << "the temporary was read back by name";
  EXPECT_EQ(written.path, ckpt + ".tmp");
  EXPECT_EQ(written.digest.size, 200000);
  // The digest counted is the file's: one written undisturbed, read back here.
  const Temporary plain = write_temporary_digested(ckpt, [&](std::ostream& out) { out << text; });
  const FileDigest read_back = digest_of(plain.path);
  EXPECT_EQ(plain.digest.size, read_back.size);
  EXPECT_EQ(plain.digest.crc32, read_back.crc32);
  EXPECT_EQ(written.digest.crc32, read_back.crc32);
}

TEST(DurableFile, ARunSubfolderThatIsALinkOrAFileIsRefusedNamingIt) {
  testing::TempDir dir;
  fs::create_directories(dir / "elsewhere");
  fs::create_symlink(dir / "elsewhere", dir / "checkpoints");
  const std::string link = usage_error_of([&] { make_run_subdir(dir / "checkpoints"); });
  EXPECT_NE(link.find(dir / "checkpoints" + " is a symbolic link"), std::string::npos) << link;
  write_file(dir / "memory", "a file");
  EXPECT_NE(usage_error_of([&] { make_run_subdir(dir / "memory"); }), "");
  make_run_subdir(dir / "mlflow");  // made
  make_run_subdir(dir / "mlflow");  // there already: fine
  EXPECT_TRUE(fs::is_directory(fs::symlink_status(dir / "mlflow")));
}

}  // namespace
}  // namespace trainer::detail
