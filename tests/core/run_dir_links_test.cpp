// A run directory is untrusted input (resumed, reported, or in a folder another user can write
// in): a symbolic link planted at a name the run writes never takes the write elsewhere. The run
// either writes its own file there (a temporary, replaced) or refuses with exit code 2 naming
// the path (a file appended to, a folder it keeps).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::kSmallRun;
using testing::read_file;
using testing::write_file;

namespace fs = std::filesystem;

class RunDirLinks : public testing::TrainerTest {
 protected:
  /// A file outside the run directory that a planted link points at.
  std::string outside(const std::string& name) const { return tmp_ / ("outside/" + name); }

  /// Plants `<run>/<rel>` as a link to outside(`rel` with / as _), a file holding "keep me" (or
  /// none: a dangling link, which a write through it would create).
  std::string plant(const std::string& rel, bool dangling) {
    std::string target_name = rel;
    for (auto& c : target_name) {
      if (c == '/') c = '_';
    }
    const std::string target = outside(target_name);
    fs::create_directories(fs::path(target).parent_path());
    if (!dangling) write_file(target, "keep me");
    fs::create_directories(fs::path(tmp_ / ("run/" + rel)).parent_path());
    fs::create_symlink(target, tmp_ / ("run/" + rel));
    return target;
  }

  /// Every file under outside/: what a write through a link would have touched.
  std::vector<std::string> outside_files() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(tmp_ / "outside", ec)) {
      if (e.is_regular_file()) out.push_back(e.path().filename().string() + "=" + read_file(e.path().string()));
    }
    return out;
  }
};

TEST_F(RunDirLinks, ALinkAtAFileTheRunAppendsToIsRefusedNamingIt) {
  for (const std::string name : {"metrics.jsonl", "trainer.log"}) {
    for (const bool dangling : {false, true}) {
      fs::remove_all(tmp_ / "run");
      fs::remove_all(tmp_ / "outside");
      plant(name, dangling);
      const RunResult r = fit(kSmallRun, {}, "run");
      EXPECT_EQ(r.exit_code, kExitUsage) << name << ": " << r.message;
      EXPECT_NE(r.message.find(tmp_ / ("run/" + name) + " is a symbolic link"), std::string::npos) << r.message;
      EXPECT_EQ(outside_files(),
                dangling ? std::vector<std::string>{}
                         : std::vector<std::string>{fs::path(outside(name)).filename().string() + "=keep me"})
          << name;
    }
  }
}

TEST_F(RunDirLinks, LinksAtTheTemporariesAreReplacedAndTheRunWritesItsOwnFiles) {
  // Two epochs of two steps, a checkpoint after each: steps 2 and 4.
  for (const std::string rel :
       {"checkpoints/step_00000002.pt.tmp", "checkpoints/step_00000004.pt.tmp", "checkpoints/step_00000004.pt.sum.tmp",
        "checkpoints/latest.tmp", "status.json.tmp", "config.toml.tmp"}) {
    plant(rel, /*dangling=*/rel.find("00000002") != std::string::npos);
  }
  const RunResult r = fit(kSmallRun, {}, "run");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(outside_files().size(), 5u);  // the five live targets, each still "keep me"
  for (const auto& f : outside_files()) EXPECT_NE(f.find("=keep me"), std::string::npos) << f;
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(tmp_ / "run/checkpoints/step_00000004.pt")));
  EXPECT_EQ(read_file(tmp_ / "run/checkpoints/latest"), "step_00000004.pt\n");
  for (const auto& e : fs::recursive_directory_iterator(tmp_ / "run")) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST_F(RunDirLinks, ACheckpointsOrMemoryFolderThatIsALinkIsRefusedNamingIt) {
  for (const std::string name : {"checkpoints", "memory"}) {
    fs::remove_all(tmp_ / "run");
    fs::remove_all(tmp_ / "outside");
    fs::create_directories(tmp_ / "outside/folder");
    fs::create_directories(tmp_ / "run");
    fs::create_symlink(tmp_ / "outside/folder", tmp_ / ("run/" + name));
    const RunResult r = fit(kSmallRun, {}, "run");
    EXPECT_EQ(r.exit_code, kExitUsage) << name << ": " << r.message;
    EXPECT_NE(r.message.find(tmp_ / ("run/" + name) + " is a symbolic link"), std::string::npos) << r.message;
    EXPECT_TRUE(fs::is_empty(tmp_ / "outside/folder")) << name;
  }
}

// The plugins' files and folders in the run directory: tensorboard/ and mlflow/ that are links
// are refused naming them; a link at the recording plugin's events.jsonl is replaced.
TEST_F(RunDirLinks, PluginFoldersThatAreLinksAreRefusedAndPluginFilesReplaced) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> folders = {
      {"tensorboard", {"plugins.load=[\"tensorboard\"]"}},
      {"mlflow", {"plugins.load=[\"mlflow\"]", "plugins.mlflow.tracking_uri=\"file:" + (tmp_ / "mlruns") + "\""}}};
  for (const auto& [name, overrides] : folders) {
    fs::remove_all(tmp_ / "run");
    fs::remove_all(tmp_ / "outside");
    fs::create_directories(tmp_ / "outside/folder");
    fs::create_directories(tmp_ / "run");
    fs::create_symlink(tmp_ / "outside/folder", tmp_ / ("run/" + name));
    const RunResult r = fit(kSmallRun, overrides, "run");
    EXPECT_EQ(r.exit_code, kExitUsage) << name << ": " << r.message;
    EXPECT_NE(r.message.find(tmp_ / ("run/" + name) + " is a symbolic link"), std::string::npos) << r.message;
    EXPECT_TRUE(fs::is_empty(tmp_ / "outside/folder")) << name;
  }
  fs::remove_all(tmp_ / "run");
  fs::remove_all(tmp_ / "outside");
  plant("events.jsonl", /*dangling=*/false);
  const RunResult r = fit(kSmallRun, {"plugins.load=[\"recording\"]"}, "run");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(outside_files(), std::vector<std::string>{"events.jsonl=keep me"});
  EXPECT_NE(read_file(tmp_ / "run/events.jsonl").find("\"event\":\"FitStart\""), std::string::npos);
}

}  // namespace
}  // namespace trainer
