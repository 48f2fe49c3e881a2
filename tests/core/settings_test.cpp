// Typed settings: one declaration per key gives its KeySpec, its default and its typed read;
// the device grammar has one parser.
#include "trainer/settings.h"

#include <gtest/gtest.h>

#include "trainer/core_settings.h"
#include "trainer/devices.h"
#include "trainer/error.h"

namespace trainer {
namespace {

struct Inner : Settings<Inner> {
  std::int64_t warmup = 3;
  static void declare(SettingsSchema<Inner>& s) { s.add(&Inner::warmup, "warmup", "Warm-up").min(0); }
};

struct Outer : Settings<Outer> {
  double lr = 0.5;
  bool on = true;
  std::string name = "x";
  std::vector<std::int64_t> sizes{1, 2};
  std::vector<double> betas{0.9};
  std::vector<std::string> tags;
  Inner inner;

  static void declare(SettingsSchema<Outer>& s) {
    s.add(&Outer::lr, "lr", "Learning rate").min(0, false);
    s.add(&Outer::on, "on", "Switch");
    s.add(&Outer::name, "name", "Name").choices({"x", "y"});
    s.add(&Outer::sizes, "sizes", "Sizes");
    s.add(&Outer::betas, "betas", "Betas");
    s.add(&Outer::tags, "tags", "Tags");
    s.include(&Outer::inner);
  }
};

TEST(Settings, KeysCarryTypesDefaultsAndRulesInDeclarationOrder) {
  const auto keys = Outer::keys();
  ASSERT_EQ(keys.size(), 7u);
  EXPECT_EQ(keys[0].key, "lr");
  EXPECT_EQ(keys[0].type, ValueType::Float);
  EXPECT_EQ(std::get<double>(*keys[0].default_value), 0.5);
  EXPECT_EQ(keys[0].describe(), "float > 0");
  EXPECT_EQ(keys[2].describe(), "string, one of: x, y");
  EXPECT_EQ(std::get<std::vector<std::int64_t>>(*keys[3].default_value), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(keys[5].type, ValueType::StringList);
  EXPECT_EQ(keys[6].key, "warmup");  // included from Inner, declared there once
  EXPECT_EQ(std::get<std::int64_t>(*keys[6].default_value), 3);
}

TEST(Settings, FromReadsTypedValuesAndKeepsDefaultsForAbsentKeys) {
  Config c = Config::parse("lr = 2\nname = \"y\"\nsizes = [4]\ntags = [\"a\", \"b\"]\nwarmup = 7\n");
  const Outer o = Outer::from(c);
  EXPECT_EQ(o.lr, 2.0);  // an integer widens to the float member
  EXPECT_TRUE(o.on);     // absent: the member's default
  EXPECT_EQ(o.name, "y");
  EXPECT_EQ(o.sizes, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(o.betas, (std::vector<double>{0.9}));
  EXPECT_EQ(o.tags, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(o.inner.warmup, 7);
}

TEST(Settings, ValidationFillsTheDefaultsTheStructDeclares) {
  Config c = Config::parse("[s]\nlr = 0.25\n");
  ASSERT_TRUE(validate_config(c, {{"s", Outer::keys(), ""}}).empty());
  EXPECT_EQ(c.get<std::string>("s.name"), "x");
  EXPECT_EQ(c.get<std::int64_t>("s.warmup"), 3);
  EXPECT_EQ(Outer::from(c.sub("s")).lr, 0.25);
}

TEST(Settings, AWrongTypeNamesTheKeyAndItsOrigin) {
  Config c = Config::parse("lr = \"fast\"\n", "r.toml");
  try {
    Outer::from(c);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("r.toml:1: key 'lr': expected float"), std::string::npos) << e.what();
  }
}

struct WithOptional : Settings<WithOptional> {
  std::optional<std::int64_t> priority;
  static void declare(SettingsSchema<WithOptional>& s) { s.add(&WithOptional::priority, "priority", "Order"); }
};

TEST(Settings, AnOptionalMemberIsAKeyWithoutDefault) {
  ASSERT_EQ(WithOptional::keys().size(), 1u);
  EXPECT_FALSE(WithOptional::keys()[0].default_value.has_value());
  EXPECT_EQ(WithOptional::keys()[0].type, ValueType::Int);
  Config empty;
  ASSERT_TRUE(validate_config(empty, {{"", WithOptional::keys(), ""}}).empty());
  EXPECT_FALSE(empty.has("priority"));  // no default filled in
  EXPECT_FALSE(WithOptional::from(empty).priority.has_value());
  EXPECT_EQ(WithOptional::from(Config::parse("priority = -3\n")).priority, -3);
}

TEST(TrainingSettings, MicroBatchZeroMeansTheBatchAndLargerIsClamped) {
  TrainingSettings t;
  t.batch_size = 64;
  EXPECT_EQ(t.micro_batch(), 64);
  t.micro_batch_size = 16;
  EXPECT_EQ(t.micro_batch(), 16);
  t.micro_batch_size = 100;
  EXPECT_EQ(t.micro_batch(), 64);
}

TEST(DeviceSetting, ParsesTheGrammar) {
  EXPECT_EQ(parse_device_setting("cpu")->kind, DeviceSetting::Kind::Cpu);
  EXPECT_EQ(parse_device_setting("cuda")->str(), "cuda:0");
  EXPECT_EQ(parse_device_setting("cuda:12")->index, 12);
  EXPECT_EQ(parse_device_setting("auto", true)->kind, DeviceSetting::Kind::Auto);
  for (const char* bad : {"auto", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:12345", "CPU", ""}) {
    EXPECT_FALSE(parse_device_setting(bad).has_value()) << bad;
  }
}

TEST(DeviceSetting, KeysWithTheCheckRejectOtherValuesWithTheGrammar) {
  Config c = Config::parse("[runtime]\ndevice = \"gpu0\"\n", "r.toml");
  const auto ps = validate_config(c, {{"runtime", RuntimeSettings::keys(), ""}});
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0], "r.toml:2: runtime.device = \"gpu0\": must be cpu, cuda or cuda:N");
  Config list = Config::parse("devices = [\"cpu\", \"cuda:1\", \"tpu\"]\n", "l.toml");
  const auto lp =
      validate_config(list, {{"", {KeySpec("devices", ValueType::StringList, "d").check(device_setting_check())}, ""}});
  ASSERT_EQ(lp.size(), 1u);
  EXPECT_NE(lp[0].find("must be cpu, cuda or cuda:N"), std::string::npos) << lp[0];
}

TEST(KeyTableMarkdown, OneRowPerKeyWithTypeDefaultAndDoc) {
  const std::string t = key_table_markdown(Outer::keys(), "plugins.x.");
  EXPECT_NE(t.find("| key | type | default | meaning |\n|---|---|---|---|\n"), std::string::npos) << t;
  EXPECT_NE(t.find("| `plugins.x.lr` | float > 0 | `0.5` | Learning rate |\n"), std::string::npos) << t;
  EXPECT_NE(t.find("| `plugins.x.sizes` | integer list | `[1, 2]` | Sizes |\n"), std::string::npos) << t;
}

}  // namespace
}  // namespace trainer
