// The `trainer` executable: exit codes and messages, run as a user would.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>

#include "support/hostile_archive.h"
#include "support/test_util.h"

namespace {

using trainer::testing::TempDir;
using trainer::testing::write_file;

struct Output {
  int code = -1;
  bool exited = false;  ///< false when a signal killed the process
  std::string text;
};

/// Runs the trainer executable with `args` (behind `prefix`, e.g. a `timeout` command).
Output run_cli(const std::string& args, const std::string& prefix = "") {
  const std::string cmd = prefix + std::string(TRAINER_CLI) + " " + args + " 2>&1";
  Output out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.text.append(buf, n);
  const int status = pclose(p);
  out.exited = WIFEXITED(status);
  out.code = out.exited ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

const std::string kRecipe = std::string(TRAINER_SOURCE_DIR) + "/recipes/fashion_mnist.toml";

/// A run of one step of the main recipe on a small slice into `run` (a run directory for a
/// resume to start from), with `extra` arguments.
Output one_step_run(const std::string& run, const std::string& extra = "") {
  return run_cli("--recipe " + kRecipe + " --run-dir " + run +
                 " dataset.limit=128 dataset.eval_limit=64 training.epochs=1 training.max_steps=1" + extra);
}

TEST(Cli, HelpAndVersion) {
  const auto help = run_cli("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.text.find("trainer --recipe FILE"), std::string::npos);
  const auto v = run_cli("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.text.find("LibTorch"), std::string::npos);
}

TEST(Cli, UnknownOptionIsAUsageError) { EXPECT_EQ(run_cli("--frobnicate").code, 2); }

// Help prints a default as it is written (0.1, not the double's 0.10000000000000001).
TEST(Cli, HelpShowsDefaultsAsWritten) {
  for (const std::string command : {"estimate", "bench"}) {
    const auto o = run_cli("help " + command);
    EXPECT_EQ(o.code, 0) << command;
    EXPECT_NE(o.text.find("--margin arg (=0.1)"), std::string::npos) << command << ": " << o.text;
    EXPECT_EQ(o.text.find("0000000"), std::string::npos) << command << ": " << o.text;
  }
  const auto lr_find = run_cli("help lr-find");
  EXPECT_NE(lr_find.text.find("--min-lr arg (=1e-07)"), std::string::npos) << lr_find.text;
}

// A data set that is not where the recipe says is a usage error (exit code 2) naming where it
// looked, as for the image data sets; so is an IDX file that is not one, or whose header claims
// more than the file can hold (refused before anything of that size is allocated).
TEST(Cli, AMissingOrBrokenFashionMnistIsAUsageError) {
  TempDir tmp;
  const std::string base = "--recipe " + kRecipe + " --run-dir " + (tmp / "run") + " training.max_steps=1 ";
  const auto missing = run_cli(base + "dataset.root=" + (tmp / "nowhere"));
  EXPECT_EQ(missing.code, 2) << missing.text;
  EXPECT_NE(
      missing.text.find("Fashion-MNIST not found: no train-images-idx3-ubyte.gz (or train-images-idx3-ubyte) in " +
                        (tmp / "nowhere")),
      std::string::npos)
      << missing.text;
  const std::string root = tmp / "broken";
  std::filesystem::create_directories(root);
  write_file(root + "/train-labels-idx1-ubyte", "");  // found; the images are read first
  write_file(root + "/train-images-idx3-ubyte", "not an IDX file");
  const auto bad = run_cli(base + "dataset.root=" + root);
  EXPECT_EQ(bad.code, 2) << bad.text;
  EXPECT_NE(bad.text.find(root + "/train-images-idx3-ubyte: not an unsigned-byte IDX file (bad magic number)"),
            std::string::npos)
      << bad.text;
  // A header of 60,000 x 28 x 28 images (47 MB) over 16 bytes of data.
  const std::string header("\x00\x00\x08\x03\x00\x00\xea\x60\x00\x00\x00\x1c\x00\x00\x00\x1c", 16);
  write_file(root + "/train-images-idx3-ubyte", header + std::string(16, '\x01'));
  const auto short_file = run_cli(base + "dataset.root=" + root);
  EXPECT_EQ(short_file.code, 2) << short_file.text;
  EXPECT_NE(
      short_file.text.find(root + "/train-images-idx3-ubyte: its IDX header says 47040000 bytes of data; the file can "
                                  "hold at most 16"),
      std::string::npos)
      << short_file.text;
}

TEST(Cli, EachCommandShowsAndTakesOnlyItsOwnOptions) {
  // The general help lists every command; a command's help only its options.
  const auto all = run_cli("--help");
  for (const char* c :
       {"trainer plugins", "trainer mem", "trainer estimate", "trainer bench", "trainer lr-find", "trainer launch",
        "trainer sweep", "trainer report", "trainer mlflow sync", "trainer help", "trainer completion"}) {
    EXPECT_NE(all.text.find(c), std::string::npos) << c;
  }
  for (const std::string how : {"help estimate", "estimate --help"}) {
    const auto o = run_cli(how);
    EXPECT_EQ(o.code, 0) << how;
    EXPECT_NE(o.text.find("--probe-sizes"), std::string::npos) << how << ": " << o.text;
    EXPECT_EQ(o.text.find("--grid"), std::string::npos) << how << ": bench's option in " << o.text;
    EXPECT_EQ(o.text.find("--run-dir"), std::string::npos) << how << ": training's option in " << o.text;
  }
  // Another command's option is refused, naming it.
  const auto wrong = run_cli("mem --grid x");
  EXPECT_EQ(wrong.code, 2);
  EXPECT_NE(wrong.text.find("trainer mem: "), std::string::npos) << wrong.text;
  EXPECT_NE(wrong.text.find("grid"), std::string::npos) << wrong.text;
  const auto nosuch = run_cli("help frobnicate");
  EXPECT_EQ(nosuch.code, 2);
  EXPECT_NE(nosuch.text.find("no command 'frobnicate'"), std::string::npos) << nosuch.text;
}

TEST(Cli, BashCompletionIsGeneratedFromTheCommandTable) {
  TempDir tmp;
  const auto script = run_cli("completion bash");
  ASSERT_EQ(script.code, 0) << script.text;
  write_file(tmp / "completion.bash", script.text);
  // What bash offers after `trainer ` + WORD and `trainer estimate --pr`.
  const auto complete = [&](const std::string& words, int cword) {
    const std::string sh = "bash -c 'source " + (tmp / "completion.bash") + "; COMP_WORDS=(" + words +
                           "); COMP_CWORD=" + std::to_string(cword) + "; _trainer; echo \"${COMPREPLY[*]}\"'";
    return trainer::testing::run_command(sh).text;
  };
  const std::string first = complete("trainer es", 1);
  EXPECT_NE(first.find("estimate"), std::string::npos) << first;
  const std::string option = complete("trainer estimate --pr", 2);
  EXPECT_NE(option.find("--probe-sizes"), std::string::npos) << option;
  EXPECT_EQ(option.find("--print-config"), std::string::npos) << option;  // training's, not estimate's
  EXPECT_NE(complete("trainer mlflow s", 2).find("sync"), std::string::npos);
  const std::string train = complete("trainer --pr", 1);
  EXPECT_NE(train.find("--print-config"), std::string::npos) << train;
}

TEST(Cli, MissingRecipeIsAUsageError) {
  const auto o = run_cli("");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("--recipe (or --resume RUN_DIR) is required"), std::string::npos) << o.text;
}

TEST(Cli, PrintConfigShowsResolvedValues) {
  const auto o = run_cli("--recipe " + kRecipe + " --print-config training.batch_size=32 model=mlp");
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("batch_size = 32"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("name = \"mlp\""), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("grad_clip_norm = 0.0"), std::string::npos) << o.text;  // defaults filled
}

TEST(Cli, ReportsAllConfigErrorsAtOnceWithExitCode2) {
  const auto o =
      run_cli("--recipe " + kRecipe + " training.batch_size=-1 training.epochs=abc traning.lr=1 model.chanels=[8]");
  EXPECT_EQ(o.code, 2) << o.text;
  EXPECT_NE(o.text.find("4 config errors"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("training.batch_size = -1: must be integer >= 1"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("did you mean 'model.channels'?"), std::string::npos) << o.text;
}

TEST(Cli, ErrorsInARecipeFileNameFileAndLine) {
  TempDir tmp;
  write_file(tmp / "bad.toml", "[model]\nname = \"mlp\"\n[dataset]\nname = \"synthetic\"\n[training]\nepochs = 0\n");
  const auto o = run_cli("--recipe " + (tmp / "bad.toml") + " --print-config");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find((tmp / "bad.toml") + ":6: training.epochs = 0"), std::string::npos) << o.text;
}

TEST(Cli, MissingRecipeFileIsNamed) {
  const auto o = run_cli("--recipe /nonexistent/r.toml");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("/nonexistent/r.toml"), std::string::npos);
}

TEST(Cli, UnknownPluginListsTheSearchPath) {
  const auto o = run_cli("--recipe " + kRecipe + " 'plugins.load=[\"nosuch\"]' --print-config");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("plugin 'nosuch' not found"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("looked for libtrainer_plugin_nosuch.so in "), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("/plugins"), std::string::npos) << o.text;
}

TEST(Cli, PluginsCommandListsEventsAndKeys) {
  const auto o = run_cli("plugins");
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("console 0.1.0"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("every_steps (integer >= 1, default 100)"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("events: Init, SelectDevice"), std::string::npos) << o.text;
}

TEST(Cli, MemShowsHostMemoryAsTextAndJson) {
  const auto text = run_cli("mem");
  EXPECT_EQ(text.code, 0) << text.text;
  EXPECT_NE(text.text.find("cpu "), std::string::npos) << text.text;
  EXPECT_NE(text.text.find("GiB"), std::string::npos) << text.text;
  const auto json = run_cli("mem --json");
  EXPECT_EQ(json.code, 0);
  const auto total = trainer::testing::json_num(json.text, "total_bytes");
  const auto free = trainer::testing::json_num(json.text, "free_bytes");
  ASSERT_TRUE(total && free) << json.text;
  EXPECT_GT(*total, 0);
  EXPECT_LE(*free, *total);
  EXPECT_GT(*trainer::testing::json_num(json.text, "process_rss_bytes"), 0);
}

TEST(Cli, TrainsAndExitsZero) {
  TempDir tmp;
  const auto o = run_cli("--recipe " + kRecipe + " --run-dir " + (tmp / "run") +
                         " dataset.limit=512 dataset.eval_limit=256 training.epochs=1 plugins.console.mode=plain"
                         " plugins.console.every_steps=1");
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("epoch 1/1 | step 4/4 | loss"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("eval/accuracy"), std::string::npos) << o.text;
  EXPECT_TRUE(std::filesystem::exists(tmp / "run/checkpoints/latest"));
}

// Plain progress lines (not a terminal): the step the run ends at is always shown, and
// plugins.console.every_s prints between every_steps lines (a tiny interval: every step).
TEST(Cli, PlainProgressShowsTheFinalStepAndPrintsOnATimeInterval) {
  TempDir tmp;
  const std::string base = "--recipe " + kRecipe +
                           " dataset.limit=512 dataset.eval_limit=128 training.epochs=1 training.max_steps=3"
                           " plugins.console.mode=plain plugins.console.every_steps=1000 --run-dir ";
  const auto end_only = run_cli(base + (tmp / "a") + " plugins.console.every_s=0");
  ASSERT_EQ(end_only.code, 0) << end_only.text;
  EXPECT_EQ(end_only.text.find("| step 2/3 |"), std::string::npos) << end_only.text;
  const auto last = end_only.text.find("epoch 1/1 | step 3/3 | loss");
  EXPECT_NE(last, std::string::npos) << end_only.text;
  EXPECT_EQ(end_only.text.find("epoch 1/1 | step 3/3 | loss", last + 1), std::string::npos) << end_only.text;
  const auto every = run_cli(base + (tmp / "b") + " plugins.console.every_s=1e-9");
  ASSERT_EQ(every.code, 0) << every.text;
  for (const char* step : {"| step 1/3 |", "| step 2/3 |", "| step 3/3 |"}) {
    EXPECT_NE(every.text.find(step), std::string::npos) << step << "\n" << every.text;
  }
}

// The documented 30-step check ends with its loss and an evaluation (eval.at_end, the default),
// though the recipe logs every 100 steps and evaluates at epoch ends only.
TEST(Cli, TheSmokePresetShowsTheLossAndAnEvaluation) {
  TempDir tmp;
  const auto o = run_cli("--recipe " + kRecipe + " smoke plugins.console.mode=plain --run-dir " + (tmp / "run"));
  ASSERT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("epoch 1/1 | step 30/30 | loss"), std::string::npos) << o.text;
  const auto eval = o.text.find("eval  epoch 1/1 |");
  ASSERT_NE(eval, std::string::npos) << o.text;
  EXPECT_NE(o.text.find("accuracy", eval), std::string::npos) << o.text;
}

TEST(Cli, SigintStopsWithACheckpointAndExitCode130) {
  TempDir tmp;
  const std::string out = tmp / "out.txt";
  // A real SIGINT once the first step's metrics are on disk: in the middle of the first epoch.
  trainer::testing::Child cli(std::string(TRAINER_CLI) + " --recipe " + kRecipe + " --run-dir " + (tmp / "run") +
                              " plugins.console.mode=plain training.log_every=1 >" + out + " 2>&1");
  ASSERT_TRUE(cli.started());
  ASSERT_TRUE(trainer::testing::wait_for_text(tmp / "run/metrics.jsonl", "train/loss"))
      << trainer::testing::read_file(out);
  ASSERT_TRUE(cli.signal(SIGINT));
  const int status = cli.wait();
  const std::string text = trainer::testing::read_file(out);
  ASSERT_TRUE(WIFEXITED(status)) << text;  // handled the signal, was not killed by it
  EXPECT_EQ(WEXITSTATUS(status), 130) << text;
  EXPECT_NE(text.find("interrupted by a signal"), std::string::npos) << text;
  EXPECT_NE(trainer::testing::read_file(tmp / "run/status.json").find("\"status\":\"KILLED\""), std::string::npos);
  EXPECT_FALSE(trainer::testing::read_file(tmp / "run/checkpoints/latest").empty());
}

// Ctrl-C during `trainer estimate` stops the probe run in progress and the estimate: exit code
// 130, and no probe directory is left behind in the temporary directory.
TEST(Cli, SigintStopsAnEstimateLeavingNoProbeDirectory) {
  TempDir tmp;
  const std::string out = tmp / "out.txt", work = tmp / "t";
  std::filesystem::create_directories(work);
  trainer::testing::Child cli("env TMPDIR=" + work + " " + TRAINER_CLI + " estimate --recipe " + kRecipe + " >" + out +
                              " 2>&1");
  ASSERT_TRUE(cli.started());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::filesystem::is_empty(work) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(std::filesystem::is_empty(work)) << trainer::testing::read_file(out);  // a probe runs
  ASSERT_TRUE(cli.signal(SIGINT));
  const int status = cli.wait();
  const std::string text = trainer::testing::read_file(out);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 130) << text;
  EXPECT_NE(text.find("trainer estimate: interrupted by a signal"), std::string::npos) << text;
  EXPECT_TRUE(std::filesystem::is_empty(work)) << std::filesystem::directory_iterator(work)->path();
}

// The build tree's trainer finds the source tree's config groups for a recipe anywhere; a group
// that is nowhere is named with the directories searched and TRAINER_CONFIG_PATH.
TEST(Cli, TheBuildTreeFindsTheSourceConfigsAndAMissingGroupSaysWhereToAddOne) {
  TempDir tmp;
  write_file(tmp / "elsewhere/recipe.toml",
             "defaults = [\"model/mlp\", \"dataset/synthetic\", \"optim/sgd\"]\n[training]\nepochs = 1\n"
             "[metrics]\nconsole = false\n");
  const auto ok = run_cli("--recipe " + (tmp / "elsewhere/recipe.toml") + " --run-dir " + (tmp / "run"));
  EXPECT_EQ(ok.code, 0) << ok.text;
  const auto missing = run_cli("--recipe " + (tmp / "elsewhere/recipe.toml") + " model=nonesuch");
  EXPECT_EQ(missing.code, 2) << missing.text;
  EXPECT_NE(missing.text.find("config group 'model/nonesuch' not found"), std::string::npos) << missing.text;
  EXPECT_NE(missing.text.find(std::string(TRAINER_SOURCE_DIR) + "/configs"), std::string::npos) << missing.text;
  EXPECT_NE(missing.text.find("TRAINER_CONFIG_PATH"), std::string::npos) << missing.text;
}

TEST(Cli, MissingDatasetFailsWithTheFixInTheMessage) {
  TempDir tmp;
  const auto o = run_cli("--recipe " + kRecipe + " --run-dir " + (tmp / "run") + " dataset.root=" + tmp.str());
  EXPECT_EQ(o.code, 2) << o.text;  // a usage error, as a missing image data set is
  EXPECT_NE(o.text.find("dataset-fashion-mnist"), std::string::npos) << o.text;
  EXPECT_NE(trainer::testing::read_file(tmp / "run/status.json").find("FAILED"), std::string::npos);
}

// `trainer --resume RUN_DIR [OVERRIDE...]`: the run goes on in its directory with the config it
// stored there, overrides applied on top and checked as with a recipe.
TEST(Cli, ResumeAloneGoesOnInTheRunDirectoryWithItsStoredConfig) {
  TempDir tmp;
  const std::string run = tmp / "run";
  const auto first = run_cli("--recipe " + kRecipe + " --run-dir " + run +
                             " dataset.limit=256 dataset.eval_limit=128 training.epochs=2 training.max_steps=1");
  ASSERT_EQ(first.code, 0) << first.text;
  const auto resumed = run_cli("--resume " + run + " training.max_steps=3");
  ASSERT_EQ(resumed.code, 0) << resumed.text;
  EXPECT_NE(resumed.text.find("run directory: " + run + " (resuming in place)"), std::string::npos) << resumed.text;
  const std::string status = trainer::testing::read_file(run + "/status.json");
  EXPECT_NE(status.find("\"status\":\"FINISHED\""), std::string::npos) << status;
  EXPECT_NE(status.find("\"global_step\":3"), std::string::npos) << status;
  EXPECT_NE(trainer::testing::read_file(run + "/metrics.jsonl").find("\"resume/step\""), std::string::npos);
  EXPECT_NE(
      trainer::testing::read_file(run + "/trainer.log").find("resumed with config changes: training.max_steps 1 -> 3"),
      std::string::npos);
  // A checkpoint file of the run's checkpoints/ finds the run's config too.
  const auto from_file = run_cli("--resume " + run + "/checkpoints/step_00000002.pt training.max_steps=4");
  EXPECT_EQ(from_file.code, 0) << from_file.text;

  const auto group = run_cli("--resume " + run + " model=mlp");
  EXPECT_EQ(group.code, 2) << group.text;
  EXPECT_NE(group.text.find("'model=mlp': --resume without --recipe uses " + run +
                            "/config.toml, which holds every key already; a group cannot be swapped under it"),
            std::string::npos)
      << group.text;
  const auto reorder = run_cli("--resume " + run + " dataset.limit=128");
  EXPECT_EQ(reorder.code, 2) << reorder.text;
  EXPECT_NE(reorder.text.find("the order of the training samples would change: dataset.limit = 256 there, 128 now"),
            std::string::npos)
      << reorder.text;
  std::filesystem::copy_file(run + "/checkpoints/step_00000004.pt", tmp / "copied.pt");
  const auto loose = run_cli("--resume " + (tmp / "copied.pt"));
  EXPECT_EQ(loose.code, 2) << loose.text;
  EXPECT_NE(loose.text.find("not a run directory or a checkpoint in a run's checkpoints/ directory, so no stored "
                            "config goes with it; give the recipe too"),
            std::string::npos)
      << loose.text;
  std::filesystem::create_directories(tmp / "empty/checkpoints");
  const auto empty = run_cli("--resume " + (tmp / "empty"));
  EXPECT_EQ(empty.code, 2) << empty.text;
  EXPECT_NE(empty.text.find((tmp / "empty") + "/config.toml not found"), std::string::npos) << empty.text;
  const auto missing = run_cli("--resume " + (tmp / "nowhere"));
  EXPECT_EQ(missing.code, 2) << missing.text;
  EXPECT_NE(missing.text.find("--resume " + (tmp / "nowhere") + ": not found"), std::string::npos) << missing.text;
  // A refused resume leaves the run as it was: its config and status are not this attempt's.
  EXPECT_NE(trainer::testing::read_file(run + "/config.toml").find("limit = 256"), std::string::npos);
  EXPECT_NE(trainer::testing::read_file(run + "/status.json").find("\"status\":\"FINISHED\""), std::string::npos);
}

// A run directory is data: the config it stored may name plugins, but a library or a directory
// to load them from runs code, and is loaded only when the user's command line gives it too.
TEST(Cli, AStoredConfigMayNamePluginsButNotPaths) {
  TempDir tmp;
  const std::string run = tmp / "run";
  const auto first = one_step_run(run);
  ASSERT_EQ(first.code, 0) << first.text;
  const std::string config = trainer::testing::read_file(run + "/config.toml");
  const std::string library = std::string(TRAINER_TEST_PLUGIN_DIR) + "/libtrainer_plugin_marker.so";
  const std::string marker = tmp / "loaded";
  const std::string env = "TRAINER_TEST_MARKER=" + marker + " ";
  const auto plant = [&](const std::string& plugins) {
    const std::regex table("\\[plugins\\]\n(?:[^\\[\\n][^\\n]*\\n)*");
    ASSERT_TRUE(std::regex_search(config, table)) << config;
    write_file(run + "/config.toml", std::regex_replace(config, table, "[plugins]\n" + plugins + "\n"));
  };

  // A library's path: refused before anything is loaded, naming the line, the key and the path.
  plant("load = [\"" + library + "\"]");
  const auto refused = run_cli("--resume " + run + " training.max_steps=2", env);
  EXPECT_EQ(refused.code, 2) << refused.text;
  EXPECT_NE(refused.text.find(run + "/config.toml:"), std::string::npos) << refused.text;
  EXPECT_NE(
      refused.text.find("plugins.load names the path '" + library + "'; a stored config may name plugins, not paths"),
      std::string::npos)
      << refused.text;
  EXPECT_FALSE(std::filesystem::exists(marker));
  // The same path on the command line is the user's: loaded.
  const auto given = run_cli("--resume " + run + " training.max_steps=2 'plugins.load=[\"" + library + "\"]'", env);
  EXPECT_EQ(given.code, 0) << given.text;
  EXPECT_TRUE(std::filesystem::exists(marker));

  // A directory to search: the same, and --plugin-dir gives it.
  std::filesystem::remove(marker);
  plant("load = [\"marker\"]\npath = [\"" + std::string(TRAINER_TEST_PLUGIN_DIR) + "\"]");
  const auto refused_dir = run_cli("--resume " + run + " training.max_steps=3", env);
  EXPECT_EQ(refused_dir.code, 2) << refused_dir.text;
  EXPECT_NE(refused_dir.text.find("plugins.path names the path '" + std::string(TRAINER_TEST_PLUGIN_DIR) + "'"),
            std::string::npos)
      << refused_dir.text;
  EXPECT_NE(refused_dir.text.find("--plugin-dir " + std::string(TRAINER_TEST_PLUGIN_DIR)), std::string::npos)
      << refused_dir.text;
  EXPECT_FALSE(std::filesystem::exists(marker));
  const auto given_dir =
      run_cli("--resume " + run + " training.max_steps=3 --plugin-dir " + std::string(TRAINER_TEST_PLUGIN_DIR), env);
  EXPECT_EQ(given_dir.code, 0) << given_dir.text;
  EXPECT_TRUE(std::filesystem::exists(marker));
}

// A stored config may not name TorchScript files either (loading one runs its code): model.path
// of model "torchscript" and task.loss_path are refused before anything is read, naming the
// line, the key and the file; given by an override, the file is the user's and is loaded (here
// a hostile archive, whose code then runs, as the user asked).
TEST(Cli, AStoredConfigMayNotNameTorchScriptFiles) {
  TempDir tmp;
  const std::string run = tmp / "run";
  const auto first = one_step_run(run);
  ASSERT_EQ(first.code, 0) << first.text;
  const std::string config = trainer::testing::read_file(run + "/config.toml");
  const std::string marker = tmp / "ran", script = tmp / "model.pt";
  write_file(script, trainer::testing::hostile_archive(marker));
  const auto plant = [&](const std::string& table, const std::string& keys) {
    const std::regex section("\\[" + table + "\\]\n(?:[^\\[\\n][^\\n]*\\n)*");
    ASSERT_TRUE(std::regex_search(config, section)) << config;
    write_file(run + "/config.toml", std::regex_replace(config, section, "[" + table + "]\n" + keys + "\n"));
  };
  plant("model", "name = \"torchscript\"\npath = \"" + script + "\"");
  const auto refused = run_cli("--resume " + run + " training.max_steps=2");
  EXPECT_EQ(refused.code, 2) << refused.text;
  EXPECT_NE(refused.text.find(run + "/config.toml:"), std::string::npos) << refused.text;
  EXPECT_NE(refused.text.find("model.path names the TorchScript file '" + script +
                              "'; a stored config may not name code to run"),
            std::string::npos)
      << refused.text;
  EXPECT_NE(refused.text.find("model.path=" + script), std::string::npos) << refused.text;
  EXPECT_FALSE(std::filesystem::exists(marker));
  const auto given = run_cli("--resume " + run + " training.max_steps=2 model.path=" + script);
  EXPECT_TRUE(std::filesystem::exists(marker)) << given.text;

  std::filesystem::remove(marker);
  plant("task", "name = \"classification\"\nloss_path = \"" + script + "\"");
  const auto refused_loss = run_cli("--resume " + run + " training.max_steps=2");
  EXPECT_EQ(refused_loss.code, 2) << refused_loss.text;
  EXPECT_NE(refused_loss.text.find("task.loss_path names the TorchScript file '" + script + "'"), std::string::npos)
      << refused_loss.text;
  EXPECT_FALSE(std::filesystem::exists(marker));
}

// A stored config is already resolved: a `defaults` list in it, whose groups would be looked for
// in and beside the run directory (data), is refused before any group is read, naming the
// line. Here a planted group loads the marker plugin by path; given as a recipe (the user's),
// the same files load it.
TEST(Cli, AStoredConfigMayNotNameGroups) {
  TempDir tmp;
  const std::string run = tmp / "run";
  const auto first = one_step_run(run);
  ASSERT_EQ(first.code, 0) << first.text;
  const std::string library = std::string(TRAINER_TEST_PLUGIN_DIR) + "/libtrainer_plugin_marker.so";
  const std::string marker = tmp / "loaded";
  const std::string env = "TRAINER_TEST_MARKER=" + marker + " ";
  for (const std::string& dir : {run + "/configs", tmp / "configs"}) {
    write_file(dir + "/plugins/x.toml", "load = [\"" + library + "\"]\n");
  }
  write_file(run + "/config.toml", "defaults = [\"plugins/x\"]\n" + trainer::testing::read_file(run + "/config.toml"));

  const auto refused = run_cli("--resume " + run + " training.max_steps=2", env);
  EXPECT_EQ(refused.code, 2) << refused.text;
  EXPECT_NE(refused.text.find(run + "/config.toml:1: defaults names config groups; a stored config is already "
                                    "resolved"),
            std::string::npos)
      << refused.text;
  EXPECT_NE(refused.text.find("trainer --recipe FILE --resume RUN_DIR"), std::string::npos) << refused.text;
  EXPECT_FALSE(std::filesystem::exists(marker));
  // --print-config reads it the same way.
  EXPECT_EQ(run_cli("--resume " + run + " --print-config", env).code, 2);
  EXPECT_FALSE(std::filesystem::exists(marker));
  // The plant works: as a recipe, its group is found beside it and loads the library.
  run_cli("--recipe " + run + "/config.toml --resume " + run + " training.max_steps=2", env);
  EXPECT_TRUE(std::filesystem::exists(marker));
}

// What a stored config resolves to is checked again before anything is loaded: a preset named
// on the command line is not looked for beside the run directory, and a TorchScript model
// that one found elsewhere sets is refused, naming the preset's line, unless an override gives
// the key. Here the model is a hostile archive whose code creates a marker file.
TEST(Cli, AStoredConfigsPresetsMayNotNameCodeEither) {
  TempDir tmp;
  const std::string run = tmp / "run";
  const auto first = one_step_run(run);
  ASSERT_EQ(first.code, 0) << first.text;
  const std::string marker = tmp / "ran", script = tmp / "model.pt";
  write_file(script, trainer::testing::hostile_archive(marker));
  const std::string preset = "[model]\nname = \"torchscript\"\npath = \"" + script + "\"\n";
  // The stored model's keys left to the preset.
  const std::string config = trainer::testing::read_file(run + "/config.toml");
  const std::regex model("\\[model\\]\n(?:[^\\[\\n][^\\n]*\\n)*");
  ASSERT_TRUE(std::regex_search(config, model)) << config;
  write_file(run + "/config.toml", std::regex_replace(config, model, "[model]\n"));

  // Planted in and beside the run directory: not found.
  for (const std::string& dir : {run + "/configs", tmp / "configs"}) write_file(dir + "/evil.toml", preset);
  const auto beside = run_cli("--resume " + run + " evil training.max_steps=2");
  EXPECT_EQ(beside.code, 2) << beside.text;
  EXPECT_NE(beside.text.find("config group 'evil' not found"), std::string::npos) << beside.text;
  EXPECT_FALSE(std::filesystem::exists(marker));

  // Found on TRAINER_CONFIG_PATH: refused, naming the preset's line, the key and the file.
  write_file(tmp / "presets/evil.toml", preset);
  const std::string env = "TRAINER_CONFIG_PATH=" + (tmp / "presets") + " ";
  const auto refused = run_cli("--resume " + run + " evil training.max_steps=2", env);
  EXPECT_EQ(refused.code, 2) << refused.text;
  EXPECT_NE(refused.text.find((tmp / "presets/evil.toml") + ":3: model.path names the TorchScript file '" + script +
                              "'; a stored config may not name code to run"),
            std::string::npos)
      << refused.text;
  EXPECT_FALSE(std::filesystem::exists(marker));
  // Given by an override, the file is the user's: loaded, and its code runs.
  const auto given = run_cli("--resume " + run + " evil training.max_steps=2 model.path=" + script, env);
  EXPECT_TRUE(std::filesystem::exists(marker)) << given.text;
}

// A run writes no secret down: config.toml holds the name of a key it left out as a secret,
// never its value, and a resume from it that does not give the key again warns that it goes
// on without it and how to give it.
TEST(Cli, AResumeNamesTheSecretsItsStoredConfigLeftOut) {
  TempDir tmp;
  const std::string run = tmp / "run";
  const std::string secret = " '+plugins.ema.hf_token=\"hf-hunter2\"'";
  const auto first = one_step_run(run, secret);
  ASSERT_EQ(first.code, 0) << first.text;
  const auto stored = [&] { return trainer::testing::read_file(run + "/config.toml"); };
  EXPECT_EQ(stored().find("hunter2"), std::string::npos) << stored();
  EXPECT_NE(stored().find("# plugins.ema.hf_token: left out (a secret); give it again on the command line: "
                          "plugins.ema.hf_token=VALUE\n"),
            std::string::npos)
      << stored();
  const std::string warning = run + "/config.toml: plugins.ema.hf_token was left out of it (a secret";

  // Given again: nothing to say, and the config it rewrites names it again.
  const auto given = run_cli("--resume " + run + " training.max_steps=2 'plugins.ema.hf_token=\"hf-hunter2\"'");
  ASSERT_EQ(given.code, 0) << given.text;
  EXPECT_EQ(given.text.find(warning), std::string::npos) << given.text;
  EXPECT_EQ(stored().find("hunter2"), std::string::npos) << stored();
  EXPECT_NE(stored().find("# plugins.ema.hf_token: left out (a secret)"), std::string::npos) << stored();

  const auto without = run_cli("--resume " + run + " training.max_steps=3");
  ASSERT_EQ(without.code, 0) << without.text;
  EXPECT_NE(without.text.find(warning), std::string::npos) << without.text;
  EXPECT_NE(without.text.find("give it again on the command line: plugins.ema.hf_token=VALUE"), std::string::npos)
      << without.text;
  EXPECT_NE(trainer::testing::read_file(run + "/trainer.log").find(warning), std::string::npos);
}

// A start that fails before training leaves no run directory of its own naming behind.
TEST(Cli, AFailedStartLeavesNoRunDirectoryOfItsOwnNaming) {
  TempDir tmp;
  const auto o = run_cli("--recipe " + kRecipe + " run.dir=" + (tmp / "runs") + " dataset.root=" + (tmp / "nowhere"));
  EXPECT_EQ(o.code, 2) << o.text;
  EXPECT_TRUE(std::filesystem::is_empty(tmp / "runs")) << o.text;
  EXPECT_EQ(o.text.find("trainer: run directory"), std::string::npos) << o.text;
}

}  // namespace

// --- devices ----------------------------------------------------------------------------
/// Environment prefix that points the CLI at the fake NVML with `script` and its own lease dir.
std::string fake_gpus(const TempDir& tmp, const std::string& script) {
  write_file(tmp / "nvml.txt", script);
  return "TRAINER_NVML_LIBRARY=" + std::string(FAKE_NVML_LIBRARY) + " FAKE_NVML_CONFIG=" + (tmp / "nvml.txt") +
         " TRAINER_LEASE_DIR=" + (tmp / "leases") + " ";
}

TEST(Cli, MemListsGpusAndTheirProcessesFromNvml) {
  TempDir tmp;
  const std::string env =
      fake_gpus(tmp, "gpu name=\"Fake H100\" total_mb=81920 used_mb=2048 util=12 procs=4242:2000\ngpu total_mb=1024\n");
  const auto text = run_cli("mem", env);
  EXPECT_EQ(text.code, 0) << text.text;
  EXPECT_NE(text.text.find("cuda:0  80.0 GiB    78.0 GiB    2.00 GiB    Fake H100, utilisation 12 %"),
            std::string::npos)
      << text.text;
  EXPECT_NE(text.text.find("pid 4242: 1.95 GiB"), std::string::npos) << text.text;
  EXPECT_NE(text.text.find("GPUs via nvml"), std::string::npos) << text.text;
  const auto json = run_cli("mem --json", env);
  EXPECT_EQ(json.code, 0);
  EXPECT_NE(json.text.find("\"source\":\"nvml\""), std::string::npos) << json.text;
  EXPECT_NE(json.text.find("\"processes\":[{\"pid\":4242,\"used_bytes\":2097152000}]"), std::string::npos) << json.text;
  EXPECT_NE(json.text.find("\"device\":\"cuda:1\""), std::string::npos) << json.text;
  // Without a driver: the CPU only, and why. CUDA_VISIBLE_DEVICES hides the GPU of a host that
  // has one (the CUDA runtime is the fallback when NVML does not load).
  const auto none = run_cli("mem", "TRAINER_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 CUDA_VISIBLE_DEVICES= ");
  EXPECT_EQ(none.code, 0);
  EXPECT_NE(none.text.find("GPUs via none; NVML: cannot load /nonexistent/libnvidia-ml.so.1"), std::string::npos)
      << none.text;
}

TEST(Cli, RobustPresetAddsItsPluginsToTheRecipes) {
  const auto o = run_cli("--recipe " + kRecipe + " --print-config robust");
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(
      o.text.find("load = [\"console\", \"mixed_precision\", \"device_select\", \"oom_backoff\", \"memory_log\"]"),
      std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("wait_for_gpu = true"), std::string::npos) << o.text;
}

TEST(Cli, RobustPresetRunsOnTheCpuWhenTheHostHasNoGpu) {
  TempDir tmp;
  const auto o =
      run_cli("--recipe " + kRecipe + " --run-dir " + (tmp / "run") +
                  " robust dataset.limit=256 dataset.eval_limit=128 training.epochs=1",
              "TRAINER_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 CUDA_VISIBLE_DEVICES= TRAINER_LEASE_DIR=" +
                  (tmp / "leases") + " ");
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("device_select: 0 GPU(s) via none"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("no GPU visible to this process"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("device: cpu"), std::string::npos) << o.text;
}

TEST(Cli, NoUsableGpuWithoutFallbackExitsWith4AndRecordsIt) {
  TempDir tmp;
  const auto o = run_cli("--recipe " + kRecipe + " --run-dir " + (tmp / "run") +
                             " robust plugins.device_select.allow_cpu_fallback=false"
                             " plugins.device_select.timeout_min=0.002 plugins.device_select.check_interval_s=0.05",
                         fake_gpus(tmp, "gpu total_mb=16384 used_mb=16000\ngpu total_mb=16384 used_mb=15000\n"));
  EXPECT_EQ(o.code, trainer::kExitNoDevice) << o.text;
  EXPECT_NE(o.text.find("check 1: no usable GPU: cuda:0 has 384 MiB free, below min_free_mb = 2048"), std::string::npos)
      << o.text;
  const std::string status = trainer::testing::read_file(tmp / "run/status.json");
  EXPECT_NE(status.find("\"status\":\"FAILED\",\"exit_code\":4"), std::string::npos) << status;
  EXPECT_NE(status.find("no usable GPU after waiting"), std::string::npos) << status;
}
