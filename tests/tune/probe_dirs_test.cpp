// Where `trainer estimate`'s probes (and `trainer bench`'s cells, `trainer sweep`'s estimates:
// the same short runs) run: a folder of their own, made by mkdtemp in $TMPDIR (mode 0700), never
// one of a predictable name that another user could create first, and never resumed.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <set>
#include <string>

#include "estimate.h"
#include "support/test_util.h"
#include "trainer/recipe.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::kSmallRun;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

namespace fs = std::filesystem;

/// The folders today's names would give the probes of probe_request() in `work`:
/// trainer-estimate-<pid>-probe-<batch>-<micro>-0, for micro-batches 2 and 4 and 4 of 16.
std::vector<std::string> predictable_folders(const std::string& work) {
  std::vector<std::string> out;
  for (const char* sizes : {"2-2-0", "4-4-0", "16-4-0"}) {
    out.push_back(work + "/trainer-estimate-" + std::to_string(::getpid()) + "-probe-" + sizes);
  }
  return out;
}

/// An estimate of the small synthetic run, probed at micro-batches 2 and 4, in `work`.
tune::EstimateRequest probe_request(const TempDir& tmp, const std::string& recipe_text, const std::string& work) {
  write_file(tmp / "recipe.toml", recipe_text);
  tune::EstimateRequest req;
  req.recipe = tmp / "recipe.toml";
  req.overrides = {"training.epochs=1"};
  req.plugin_dirs = {TRAINER_TEST_PLUGIN_DIR};
  req.probe_sizes = {2, 4};
  req.work_dir = work;
  return req;
}

/// Every file under `dir` with its contents (links by their target), to compare before and after.
std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    if (e.is_symlink()) {
      out.insert(rel + " -> " + fs::read_symlink(e.path()).string());
    } else if (e.is_regular_file()) {
      out.insert(rel + " = " + read_file(e.path().string()));
    } else {
      out.insert(rel + "/");
    }
  }
  return out;
}

TEST(ProbeDirs, AFolderOfThePredictableNameIsNeitherUsedWrittenThroughNorRemoved) {
  TempDir tmp;
  const std::string work = tmp / "shared-tmp";
  // What another user plants before the estimate: a folder at each name, with a checkpoint and
  // links out (a dangling one: writing through it would create the file).
  for (const auto& dir : predictable_folders(work)) {
    write_file(dir + "/checkpoints/latest", "step_00000001.pt\n");
    write_file(dir + "/checkpoints/step_00000001.pt", "planted");
    fs::create_symlink(tmp / "created-through-a-link.log", dir + "/trainer.log");
    fs::create_symlink(tmp / "created-through-a-link.toml", dir + "/config.toml.tmp");
  }
  const auto before = listing(work);
  const tune::MemoryEstimate e = tune::estimate_memory(probe_request(tmp, kSmallRun, work));
  ASSERT_EQ(e.probes.size(), 3u);
  for (const auto& p : e.probes) EXPECT_EQ(p.error, "") << p.micro_batch;
  EXPECT_EQ(listing(work), before);  // untouched, and nothing of the probes left beside them
  EXPECT_FALSE(fs::exists(tmp / "created-through-a-link.log"));
  EXPECT_FALSE(fs::exists(tmp / "created-through-a-link.toml"));
}

// A recipe with checkpoint.autoresume = true and a checkpoint planted where today's folders
// would be: no probe resumes from it. (Each probe's folder is new and empty, so there is nothing
// there to resume; run_short also turns autoresume off, in case a recipe could ever point a run
// at checkpoints elsewhere.)
TEST(ProbeDirs, AProbeNeverResumesEvenWithAutoresumeInTheRecipe) {
  TempDir tmp;
  const std::string recipe = std::string(kSmallRun) + "[checkpoint]\nautoresume = true\n";
  // A real checkpoint of this recipe, 4 steps in (more than a probe's 3), planted where today's
  // probes would run: a probe that resumed from it would train no step.
  write_file(tmp / "source.toml", recipe);
  PreparedRun p = prepare_run(tmp / "source.toml", {}, {});
  TrainerOptions o;
  o.config = p.config;
  o.plugins = p.plugins;
  o.run_dir = tmp / "source";
  o.log_level = "error";
  ASSERT_EQ(Trainer(std::move(o)).fit().exit_code, kExitOk);
  const std::string work = tmp / "shared-tmp";
  for (const auto& dir : predictable_folders(work)) {
    fs::create_directories(dir);
    fs::copy(tmp / "source/checkpoints", dir + "/checkpoints", fs::copy_options::recursive);
  }
  const auto before = listing(work);
  const tune::MemoryEstimate e = tune::estimate_memory(probe_request(tmp, recipe, work));
  ASSERT_EQ(e.probes.size(), 3u);
  for (const auto& probe : e.probes) EXPECT_EQ(probe.error, "") << probe.micro_batch;
  EXPECT_GT(e.peak, 0);
  EXPECT_EQ(listing(work), before);
}

TEST(ProbeDirs, EachProbeRunsInAPrivateFolderItMadeItself) {
  TempDir tmp;
  const std::string work = tmp / "shared-tmp";
  fs::create_directories(work);
  // Each probe stalls a moment after its first step (the test plugin), while its folder is looked at.
  const std::string recipe =
      std::string(kSmallRun) + "[plugins]\nload = [\"stall\"]\n[plugins.stall]\nrank = 0\nat_step = 1\nseconds = 0.3\n";
  const auto req = probe_request(tmp, recipe, work);
  auto estimate = std::async(std::launch::async, [&req] { return tune::estimate_memory(req); });
  std::set<std::string> seen;
  while (estimate.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready) {
    for (const auto& e : fs::directory_iterator(work)) {
      struct stat st {};
      if (::lstat(e.path().c_str(), &st) != 0) continue;  // gone meanwhile
      EXPECT_TRUE(S_ISDIR(st.st_mode)) << e.path();
      EXPECT_EQ(st.st_mode & 07777, 0700u) << e.path();
      EXPECT_EQ(st.st_uid, ::getuid()) << e.path();
      seen.insert(e.path().filename().string());
    }
  }
  const tune::MemoryEstimate e = estimate.get();
  EXPECT_EQ(e.probes.size(), 3u);
  ASSERT_EQ(seen.size(), 3u);  // one folder per probe, each new
  for (const auto& name : seen) EXPECT_EQ(name.rfind("trainer-estimate-probe-", 0), 0u) << name;
  EXPECT_TRUE(fs::is_empty(work));  // each removed after its probe
}

}  // namespace
}  // namespace trainer
