#include "trainer/recipe.h"

#include <gtest/gtest.h>

#include <limits>

#include "support/test_util.h"
#include "trainer/error.h"

namespace trainer {
namespace {

using testing::TempDir;
using testing::write_file;

TEST(ParseOverride, RecognisesEveryForm) {
  EXPECT_EQ(parse_override("a.b=1").kind, Override::Kind::Set);
  EXPECT_EQ(parse_override("+a.b=1").kind, Override::Kind::Add);
  EXPECT_EQ(parse_override("robust").kind, Override::Kind::Preset);
  const Override o = parse_override("training.lr=0.5");
  EXPECT_EQ(o.key, "training.lr");
  EXPECT_EQ(o.value, "0.5");
}

TEST(ParseOverride, RejectsBadSyntax) {
  EXPECT_THROW(parse_override("=3"), ConfigError);
  EXPECT_THROW(parse_override("a..b=1"), ConfigError);
  EXPECT_THROW(parse_override("a.b="), ConfigError);
  EXPECT_THROW(parse_override("+a.b"), ConfigError);
  EXPECT_THROW(parse_override("a.b"), ConfigError);
}

TEST(ParseOverrideValue, TypesValuesLikeToml) {
  EXPECT_EQ(std::get<std::int64_t>(parse_override_value("32")), 32);
  EXPECT_DOUBLE_EQ(std::get<double>(parse_override_value("1e-3")), 1e-3);
  EXPECT_TRUE(std::get<bool>(parse_override_value("true")));
  EXPECT_EQ(std::get<std::vector<std::int64_t>>(parse_override_value("[1, 2]")), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(std::get<std::vector<std::string>>(parse_override_value("[\"a\"]")), (std::vector<std::string>{"a"}));
  EXPECT_EQ(std::get<std::string>(parse_override_value("\"x y\"")), "x y");
  EXPECT_EQ(std::get<std::string>(parse_override_value("baseline")), "baseline");
  EXPECT_EQ(std::get<std::string>(parse_override_value("/data/x")), "/data/x");
}

class LoadRecipe : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(tmp_ / "configs/model/mlp.toml", "name = \"mlp\"\nhidden = [8]\n");
    write_file(tmp_ / "configs/model/cnn.toml", "name = \"cnn\"\nchannels = [4]\n");
    write_file(tmp_ / "configs/dataset/synthetic.toml", "name = \"synthetic\"\nsize = 32\n");
    write_file(tmp_ / "configs/fast.toml", "[training]\nepochs = 1\nmax_steps = 2\n");
    write_file(tmp_ / "recipes/r.toml",
               "defaults = [\"model/mlp\", \"dataset/synthetic\"]\n[training]\nepochs = 3\nbatch_size = 8\n");
  }
  std::string recipe() const { return tmp_ / "recipes/r.toml"; }
  TempDir tmp_;
};

TEST_F(LoadRecipe, MergesGroupsUnderTheirPackageThenTheRecipe) {
  const auto r = load_recipe(recipe(), {});
  EXPECT_EQ(r.config.get<std::string>("model.name"), "mlp");
  EXPECT_EQ(r.config.get<std::int64_t>("dataset.size"), 32);
  EXPECT_EQ(r.config.get<std::int64_t>("training.epochs"), 3);
  EXPECT_EQ(r.sources.size(), 3u);
  EXPECT_NE(r.config.origin("model.hidden").find("configs/model/mlp.toml:2"), std::string::npos);
}

TEST_F(LoadRecipe, PluginListsAccumulateAcrossGroupsRecipeAndPresets) {
  write_file(tmp_ / "configs/robust.toml", "[plugins]\nload = [\"device_select\", \"oom_backoff\"]\n");
  write_file(tmp_ / "configs/logs.toml", "[plugins]\nload = [\"memory_log\", \"oom_backoff\"]\n");
  write_file(tmp_ / "recipes/p.toml", "defaults = [\"model/mlp\", \"robust\"]\n[plugins]\nload = [\"console\"]\n");
  using List = std::vector<std::string>;
  const auto r = load_recipe(tmp_ / "recipes/p.toml", {"logs"});
  EXPECT_EQ(r.config.get<List>("plugins.load"), (List{"device_select", "oom_backoff", "console", "memory_log"}));
  // An override replaces the list.
  const auto o = load_recipe(tmp_ / "recipes/p.toml", {"logs", "plugins.load=[\"console\"]"});
  EXPECT_EQ(o.config.get<List>("plugins.load"), (List{"console"}));
}

TEST_F(LoadRecipe, OverridesWinAndRecordTheirOrigin) {
  const auto r = load_recipe(recipe(), {"training.epochs=5", "run.name=baseline"});
  EXPECT_EQ(r.config.get<std::int64_t>("training.epochs"), 5);
  EXPECT_EQ(r.config.get<std::string>("run.name"), "baseline");
  EXPECT_EQ(r.config.origin("training.epochs"), "override 'training.epochs=5'");
}

TEST_F(LoadRecipe, GroupSelectionReplacesTheDefault) {
  const auto r = load_recipe(recipe(), {"model=cnn"});
  EXPECT_EQ(r.config.get<std::string>("model.name"), "cnn");
  EXPECT_FALSE(r.config.has("model.hidden"));
}

TEST_F(LoadRecipe, CommandLinePresetMergesAtTheRootAndWinsOverTheRecipe) {
  const auto r = load_recipe(recipe(), {"fast"});
  EXPECT_EQ(r.config.get<std::int64_t>("training.max_steps"), 2);
  EXPECT_EQ(r.config.get<std::int64_t>("training.epochs"), 1);
  EXPECT_EQ(r.config.get<std::int64_t>("training.batch_size"), 8);  // untouched recipe keys stay
}

TEST_F(LoadRecipe, KeyOverridesWinOverPresets) {
  const auto r = load_recipe(recipe(), {"training.epochs=7", "fast"});
  EXPECT_EQ(r.config.get<std::int64_t>("training.epochs"), 7);
}

TEST_F(LoadRecipe, MissingGroupFromTheCommandLineNamesTheOverride) {
  try {
    load_recipe(recipe(), {"model=resnet"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("override 'model=resnet': config group"), std::string::npos) << e.what();
  }
}

// A group name is a name, not a path: one that would leave the config directories, or that the
// file system refuses (longer than a file name may be: a fuzzer's find), is a ConfigError naming
// the override, never a file read elsewhere nor a crash.
TEST_F(LoadRecipe, AGroupNameThatIsAPathOrTooLongIsRefused) {
  write_file(tmp_ / "secret.toml", "[training]\nepochs = 99\n");
  for (const std::string& group :
       {std::string("../secret"), std::string("model/../../secret"), std::string(5000, 'x')}) {
    SCOPED_TRACE(group.substr(0, 40));
    try {
      load_recipe(recipe(), {"model=" + group});
      FAIL();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("is not a config group name"), std::string::npos) << e.what();
    }
  }
}

TEST_F(LoadRecipe, MissingGroupListsTheAvailableOnes) {
  try {
    load_recipe(recipe(), {"model=resnet"});
    FAIL();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("config group 'model/resnet' not found"), std::string::npos) << msg;
    EXPECT_NE(msg.find("available for model: cnn, mlp"), std::string::npos) << msg;
  }
}

TEST_F(LoadRecipe, CollectsEveryProblemBeforeThrowing) {
  try {
    load_recipe(recipe(), {"a..b=1", "=2", "model=nope"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.problems().size(), 3u) << e.what();
  }
}

TEST_F(LoadRecipe, ValidationReportsOverrideOrigins) {
  auto r = load_recipe(recipe(), {"training.batch_size=-1", "training.epochs=abc", "traning.zzz=1"});
  try {
    validate_recipe(r);
    FAIL();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.problems().size(), 3u) << msg;
    EXPECT_NE(msg.find("override 'training.batch_size=-1': training.batch_size = -1: must be integer >= 1"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("override 'training.epochs=abc': training.epochs = \"abc\": expected integer"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("override 'traning.zzz=1': no key 'traning.zzz'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean section [training]?"), std::string::npos) << msg;
  }
}

// Keys users bring from Lightning, Hugging Face's Trainer and torchtune get trainer's key of that
// meaning, also in another section; a list whose words the shell stripped of their quotes gets
// the command line that keeps them.
TEST_F(LoadRecipe, OtherToolsKeysAndUnquotedListsGetTheLineToWrite) {
  auto r = load_recipe(recipe(), {"optim.learning_rate=1e-3", "optim.warmup=10", "training.max_epochs=3"});
  try {
    validate_recipe(r);
    FAIL();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.problems().size(), 3u) << msg;
    EXPECT_NE(msg.find("no key 'optim.learning_rate' in the recipe or its schema; did you mean 'optim.lr'?"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("no key 'optim.warmup' in the recipe or its schema; did you mean 'sched.warmup_steps'?"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("no key 'training.max_epochs' in the recipe or its schema; did you mean 'training.epochs'?"),
              std::string::npos)
        << msg;
  }
  try {
    load_recipe(recipe(), {"plugins.load=[console,early_stopping]"});
    FAIL();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("override 'plugins.load=[console,early_stopping]': [console,early_stopping] is not a TOML "
                       "list: its words need quotes, [\"console\", \"early_stopping\"]"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("on the command line, in single quotes: 'plugins.load=[\"console\", \"early_stopping\"]'"),
              std::string::npos)
        << msg;
  }
  // The quoted list, and a string that starts with '[' when quoted, are taken.
  EXPECT_EQ(std::get<std::vector<std::string>>(parse_override_value("[\"console\", \"early_stopping\"]")),
            (std::vector<std::string>{"console", "early_stopping"}));
  EXPECT_EQ(std::get<std::string>(parse_override_value("\"[a,b]\"")), "[a,b]");
}

TEST_F(LoadRecipe, AddRequiresANewKeyAndSetAKnownOne) {
  auto r = load_recipe(recipe(), {"+training.epochs=2"});
  EXPECT_THROW(validate_recipe(r), ConfigError);
  auto ok = load_recipe(recipe(), {"training.grad_clip_norm=1.0"});  // in the schema, not the recipe
  EXPECT_NO_THROW(validate_recipe(ok));
  EXPECT_DOUBLE_EQ(ok.config.get<double>("training.grad_clip_norm"), 1.0);
}

TEST_F(LoadRecipe, UnknownModelNameListsTheKnownOnes) {
  auto r = load_recipe(recipe(), {"model.name=densenet"});
  try {
    validate_recipe(r);
    FAIL();
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.problems().size(), 1u) << e.what();  // hidden=[8] is not reported on top
    EXPECT_NE(e.problems()[0].find("one of: bert, cnn, mlp, resnet, torchscript, vit"), std::string::npos) << e.what();
  }
}

TEST_F(LoadRecipe, MicroBatchLargerThanBatchIsAccepted) {
  // `training.batch_size=4` on a recipe with a larger micro-batch must just work; the
  // trainer clamps the micro-batch to the batch.
  auto r = load_recipe(recipe(), {"training.micro_batch_size=16"});
  EXPECT_NO_THROW(validate_recipe(r));
}

TEST_F(LoadRecipe, BadDeviceIsRejected) {
  auto r = load_recipe(recipe(), {"runtime.device=gpu0"});
  EXPECT_THROW(validate_recipe(r), ConfigError);
}

TEST_F(LoadRecipe, APluginThatIsNotFoundNamesTheRecipeLineThatListsIt) {
  write_file(tmp_ / "recipes/p.toml", "defaults = [\"model/mlp\"]\n[plugins]\nload = [\"recording\", \"nowhere\"]\n");
  try {
    prepare_run(tmp_ / "recipes/p.toml", {}, {TRAINER_TEST_PLUGIN_DIR});
    FAIL();
  } catch (const PluginError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(tmp_ / "recipes/p.toml:3: plugins.load entry 'nowhere': "), std::string::npos) << msg;
  }
}

TEST_F(LoadRecipe, TheSectionOfAPluginLeftOutOfPluginsLoadIsInert) {
  write_file(tmp_ / "recipes/p.toml",
             "defaults = [\"model/mlp\", \"dataset/synthetic\"]\n[plugins]\nload = [\"recording\"]\n"
             "[plugins.recording]\nevents = [\"FitEnd\"]\n[plugins.console]\nevery_steps = 5\nno_such_key = 1\n");
  // Switched off from the command line: its section stays, unchecked, and a note says so.
  const PreparedRun off = prepare_run(tmp_ / "recipes/p.toml", {"plugins.load=[]", "plugins.console.mode=plain"},
                                      {TRAINER_BUILD_PLUGIN_DIR});
  EXPECT_TRUE(off.plugins.empty());
  EXPECT_EQ(off.config.get<std::string>("plugins.console.mode"), "plain");  // kept, unchecked
  ASSERT_EQ(off.notes.size(), 2u);
  EXPECT_EQ(off.notes[0], "[plugins.console] is inert: plugin 'console' is not in plugins.load");
  EXPECT_EQ(off.notes[1], "[plugins.recording] is inert: plugin 'recording' is not in plugins.load");
  // A section that names no plugin found is a typo, not a switch: an error with a did-you-mean.
  write_file(tmp_ / "recipes/q.toml",
             "defaults = [\"model/mlp\", \"dataset/synthetic\"]\n[plugins]\nload = [\"recording\"]\n"
             "[plugins.recordin]\nevents = [\"FitEnd\"]\n");
  try {
    prepare_run(tmp_ / "recipes/q.toml", {}, {TRAINER_TEST_PLUGIN_DIR});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(tmp_ / "recipes/q.toml:5: [plugins.recordin] configures plugin 'recordin', "
                                                "which is neither loaded nor found; did you mean [plugins.recording]?"),
              std::string::npos)
        << e.what();
  }
  // A loaded plugin's section is checked as before.
  try {
    prepare_run(tmp_ / "recipes/p.toml", {"plugins.load=[\"recording\", \"console\"]"}, {TRAINER_BUILD_PLUGIN_DIR});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'plugins.console.no_such_key'"), std::string::npos) << e.what();
  }
}

TEST_F(LoadRecipe, APluginListedTwiceIsAnErrorNamingBothEntries) {
  const std::string by_path = std::string(TRAINER_TEST_PLUGIN_DIR) + "/libtrainer_plugin_recording.so";
  for (const std::string& second : {std::string("recording"), by_path}) {
    SCOPED_TRACE(second);
    try {
      prepare_run(recipe(), {"plugins.load=[\"recording\", \"" + second + "\"]"}, {TRAINER_TEST_PLUGIN_DIR});
      FAIL();
    } catch (const UsageError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("override 'plugins.load="), std::string::npos) << msg;
      EXPECT_NE(msg.find("lists plugin 'recording' twice, as 'recording' and as '" + second + "'"), std::string::npos)
          << msg;
    }
  }
}

/// The problems validation (or loading) reports for `overrides` on the test recipe.
std::string problems_of(const std::string& recipe, const std::vector<std::string>& overrides) {
  try {
    auto r = load_recipe(recipe, overrides);
    validate_recipe(r);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST_F(LoadRecipe, NumbersOutsideTheirTypeAreErrorsNamingTheSourceAndTheRange) {
  const std::string max = std::to_string(std::numeric_limits<std::int64_t>::max());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"training.epochs=99999999999999999999",
       "override 'training.epochs=99999999999999999999': "
       "99999999999999999999 is outside the integer range"},
      {"training.epochs=-99999999999999999999", "is outside the integer range [-9223372036854775808, " + max + "]"},
      {"optim.lr=nan", "override 'optim.lr=nan': optim.lr = nan: not a finite number"},
      {"optim.lr=-inf", "optim.lr = -inf: not a finite number"},
      {"optim.lr=1e-320", "optim.lr = 1e-320: too close to zero to be a normal double"},
      {"optim.lr=1e999", "override 'optim.lr=1e999': 1e999 is outside the range of a float"},
      {"optim.lr=1e-999", "override 'optim.lr=1e-999': 1e-999 is too close to zero for a float"},
      {"memory.limit_mb=1e300", "memory.limit_mb = 1e+300: must be float >= 0 and <= 1e+09"},
  };
  for (const auto& [override_text, expected] : cases) {
    const std::string msg = problems_of(recipe(), {override_text});
    EXPECT_NE(msg.find(expected), std::string::npos) << override_text << " -> " << msg;
  }
  // Digits that are not a TOML number, but not out of range either, stay a string.
  const auto r = load_recipe(recipe(), {"run.name=007"});
  EXPECT_EQ(r.config.get<std::string>("run.name"), "007");
}

TEST_F(LoadRecipe, AnEmptyRecipeAndItsMissingKeysNameTheFile) {
  write_file(tmp_ / "recipes/empty.toml", "");
  const std::string msg = problems_of(tmp_ / "recipes/empty.toml", {});
  EXPECT_NE(msg.find(tmp_ / "recipes/empty.toml: the recipe is empty"), std::string::npos) << msg;
  EXPECT_NE(msg.find(tmp_ / "recipes/empty.toml: missing required key 'model.name'"), std::string::npos) << msg;
}

TEST_F(LoadRecipe, NumbersOutsideTheirTypeInARecipeFileNameItsLine) {
  write_file(tmp_ / "recipes/nan.toml", "defaults = [\"model/mlp\", \"dataset/synthetic\"]\n[optim]\nlr = nan\n");
  std::string msg = problems_of(tmp_ / "recipes/nan.toml", {});
  EXPECT_NE(msg.find("recipes/nan.toml:3: optim.lr = nan: not a finite number"), std::string::npos) << msg;
  write_file(tmp_ / "recipes/big.toml",
             "defaults = [\"model/mlp\", \"dataset/synthetic\"]\n[training]\nepochs = 99999999999999999999\n");
  msg = problems_of(tmp_ / "recipes/big.toml", {});
  EXPECT_NE(msg.find("recipes/big.toml:3: key 'training.epochs': integer outside the range"), std::string::npos) << msg;
  write_file(tmp_ / "recipes/huge.toml",
             "defaults = [\"model/mlp\", \"dataset/synthetic\"]\n[optim]\nbetas = [0.9, 1e400]\n");
  msg = problems_of(tmp_ / "recipes/huge.toml", {});
  EXPECT_NE(msg.find("recipes/huge.toml:3: key 'optim.betas': element 1: 1e400 is outside the range of a float"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace trainer
