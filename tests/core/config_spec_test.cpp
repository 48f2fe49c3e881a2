#include "trainer/config_spec.h"

#include <gtest/gtest.h>

namespace trainer {
namespace {

std::vector<SectionSpec> spec() {
  using T = ValueType;
  return {{"training",
           {KeySpec("epochs", T::Int, "epochs").def(std::int64_t{1}).min(1),
            KeySpec("lr", T::Float, "lr").def(0.1).min(0, false),
            KeySpec("mode", T::String, "mode").def(std::string("fast")).choices({"fast", "slow"}),
            KeySpec("sizes", T::IntList, "sizes").def(std::vector<std::int64_t>{1}).min(1)},
           ""},
          {"model", {KeySpec("name", T::String, "name").required()}, ""}};
}

bool contains(const std::vector<std::string>& ps, const std::string& needle) {
  for (const auto& p : ps) {
    if (p.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(ValidateConfig, FillsDefaultsAndCoercesIntToFloat) {
  Config c = Config::parse("[training]\nlr = 1\n[model]\nname = \"m\"\n");
  EXPECT_TRUE(validate_config(c, spec()).empty());
  EXPECT_EQ(c.get<std::int64_t>("training.epochs"), 1);
  EXPECT_EQ(c.origin("training.epochs"), "default");
  EXPECT_TRUE(std::holds_alternative<double>(c.value("training.lr")));
}

TEST(ValidateConfig, ReportsEveryProblemAtOnce) {
  Config c =
      Config::parse("[training]\nepochs = 0\nlr = \"x\"\nmode = \"fats\"\nepoch = 3\nsizes = [1, 0]\n", "r.toml");
  const auto ps = validate_config(c, spec());
  ASSERT_EQ(ps.size(), 6u) << ::testing::PrintToString(ps);
  EXPECT_TRUE(contains(ps, "r.toml:2: training.epochs = 0: must be integer >= 1"));
  EXPECT_TRUE(contains(ps, "r.toml:3: training.lr = \"x\": expected float > 0, got string"));
  EXPECT_TRUE(contains(ps, "did you mean 'fast'?"));
  EXPECT_TRUE(contains(ps, "unknown key 'training.epoch'; did you mean 'training.epochs'?"));
  EXPECT_TRUE(contains(ps, "training.sizes = [1, 0]: must be integer list with elements >= 1"));
  EXPECT_TRUE(contains(ps, "missing required key 'model.name'"));
}

TEST(ValidateConfig, UnknownSectionGetsAHint) {
  Config c = Config::parse("[traning]\nepochs = 2\n[model]\nname = \"m\"\n", "r.toml");
  const auto ps = validate_config(c, spec());
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_TRUE(contains(ps, "r.toml:2: unknown key 'traning.epochs'; did you mean 'training.epochs'?"));
}

TEST(ValidateConfig, OpenSectionsAcceptAnything) {
  Config c = Config::parse("[model]\nname = \"m\"\nwhatever = 1\n");
  EXPECT_TRUE(validate_config(c, spec(), {"model.whatever"}).empty());
}

TEST(ValidateConfig, TableWhereValueExpected) {
  Config c = Config::parse("[model]\nname = \"m\"\n[training.epochs]\nx = 1\n");
  const auto ps = validate_config(c, spec());
  EXPECT_TRUE(contains(ps, "'training.epochs' must be a value of type integer, not a table"))
      << ::testing::PrintToString(ps);
}

TEST(ClosestMatch, FindsSmallEdits) {
  EXPECT_EQ(closest_match("batch_sise", {"batch_size", "epochs"}), "batch_size");
  EXPECT_EQ(closest_match("zzzzzz", {"batch_size", "epochs"}), "");
  EXPECT_EQ(closest_match("fats", {"fast", "slow"}), "fast");  // two letters swapped: one edit
  // At most one edit in four letters: two of three letters changed is another word.
  EXPECT_EQ(closest_match("zzz", {"npz", "npy", "csv"}), "");
  EXPECT_EQ(closest_match("warmup", {"name", "lr"}), "");
}

TEST(DidYouMean, OtherToolsNamesOtherSectionsAndNoWildGuesses) {
  const std::vector<std::string> known = {"optim.name",
                                          "optim.lr",
                                          "optim.weight_decay",
                                          "sched.name",
                                          "sched.warmup_steps",
                                          "training.epochs",
                                          "training.batch_size",
                                          "training.max_steps",
                                          "training.micro_batch_size",
                                          "run.seed",
                                          "eval.batch_size"};
  EXPECT_EQ(did_you_mean("optim.learning_rate", known), "; did you mean 'optim.lr'?");
  EXPECT_EQ(did_you_mean("optim.warmup", known), "; did you mean 'sched.warmup_steps'?");
  EXPECT_EQ(did_you_mean("training.warmup_steps", known), "; did you mean 'sched.warmup_steps'?");
  EXPECT_EQ(did_you_mean("training.max_epochs", known), "; did you mean 'training.epochs'?");
  EXPECT_EQ(did_you_mean("training.gradient_accumulation_steps", known),
            "; did you mean 'training.micro_batch_size'? (trainer takes the samples per forward: batch_size / "
            "accumulation steps)");
  EXPECT_EQ(did_you_mean("training.epoch", known), "; did you mean 'training.epochs'?");
  EXPECT_EQ(did_you_mean("training.batch_size_", known), "; did you mean 'training.batch_size'?");
  EXPECT_EQ(did_you_mean("model.name", known), "; did you mean one of 'optim.name', 'sched.name'?");
  EXPECT_EQ(did_you_mean("traning.epochs", known), "; did you mean 'training.epochs'?");
  EXPECT_EQ(did_you_mean("evl.batch_size", known), "; did you mean 'eval.batch_size'?");  // the section first
  EXPECT_EQ(did_you_mean("traiing.batch_sise", known), "; did you mean 'training.batch_size'?");
  EXPECT_EQ(did_you_mean("eval.max_steps", known), "; did you mean 'training.max_steps'?");  // alias
  EXPECT_EQ(did_you_mean("training.micro_batch", known), "; did you mean 'training.micro_batch_size'?");
  EXPECT_EQ(did_you_mean("optim.seed", {"optim.name", "run.seed"}), "; did you mean 'run.seed'?");
  EXPECT_EQ(did_you_mean("eval.shuffle", {"eval.batch_size", "training.shuffle"}),
            "; did you mean 'training.shuffle'?");  // the same name in another section
  // A plugin's section has its own keys: no other tool's name is taken for the core's there.
  EXPECT_EQ(did_you_mean("plugins.device_select.accelerator", {"runtime.device", "plugins.device_select.device"}), "");
  EXPECT_EQ(did_you_mean("trainig.zzz", known), "; did you mean section [training]?");
  EXPECT_EQ(did_you_mean("optim.zzz", known), "");  // a known section and nothing near: no guess
  EXPECT_EQ(did_you_mean("optim.warmup", {"optim.name", "optim.lr"}), "");  // no [sched] in this schema
}

}  // namespace
}  // namespace trainer
