#include "trainer/config.h"

#include <gtest/gtest.h>

#include "support/test_util.h"
#include "trainer/error.h"

namespace trainer {
namespace {

using testing::TempDir;
using testing::write_file;

TEST(Config, ParsesEveryValueType) {
  const Config c = Config::parse(R"(
a = 3
b = 0.5
c = true
d = "x"
e = [1, 2]
f = [1, 2.5]
g = ["p", "q"]
[t.u]
v = 7
)",
                                 "mem.toml");
  EXPECT_EQ(c.get<std::int64_t>("a"), 3);
  EXPECT_DOUBLE_EQ(c.get<double>("b"), 0.5);
  EXPECT_TRUE(c.get<bool>("c"));
  EXPECT_EQ(c.get<std::string>("d"), "x");
  EXPECT_EQ(c.get<std::vector<std::int64_t>>("e"), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(c.get<std::vector<double>>("f"), (std::vector<double>{1.0, 2.5}));
  EXPECT_EQ(c.get<std::vector<std::string>>("g"), (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(c.get<std::int64_t>("t.u.v"), 7);
  EXPECT_TRUE(c.is_table("t.u"));
}

TEST(Config, IntegersWidenToFloat) {
  const Config c = Config::parse("lr = 1\nxs = [1, 2]");
  EXPECT_DOUBLE_EQ(c.get<double>("lr"), 1.0);
  EXPECT_EQ(c.get<std::vector<double>>("xs"), (std::vector<double>{1.0, 2.0}));
}

TEST(Config, RemembersFileAndLine) {
  TempDir tmp;
  write_file(tmp / "r.toml", "[training]\n\nbatch_size = 3\n");
  const Config c = Config::parse_file(tmp / "r.toml");
  EXPECT_EQ(c.origin("training.batch_size"), (tmp / "r.toml") + ":3");
}

TEST(Config, WrongTypeNamesKeyOriginAndTypes) {
  const Config c = Config::parse("[training]\nbatch_size = \"big\"\n", "r.toml");
  try {
    c.get<std::int64_t>("training.batch_size");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("r.toml:2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("training.batch_size"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected integer, got string \"big\""), std::string::npos) << msg;
  }
}

TEST(Config, SyntaxErrorNamesTheFile) {
  TempDir tmp;
  write_file(tmp / "bad.toml", "a = [1, \n");
  try {
    Config::parse_file(tmp / "bad.toml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.toml"), std::string::npos) << e.what();
  }
}

TEST(Config, MissingFileIsAConfigError) { EXPECT_THROW(Config::parse_file("/nonexistent/recipe.toml"), ConfigError); }

TEST(Config, MixedArraysAreRejected) { EXPECT_THROW(Config::parse("a = [1, \"x\"]"), ConfigError); }

TEST(Config, MergeIsDeep) {
  Config a = Config::parse("[m]\nx = 1\ny = 2\n");
  a.merge(Config::parse("[m]\ny = 3\nz = 4\n"));
  EXPECT_EQ(a.get<std::int64_t>("m.x"), 1);
  EXPECT_EQ(a.get<std::int64_t>("m.y"), 3);
  EXPECT_EQ(a.get<std::int64_t>("m.z"), 4);
}

TEST(Config, ToTomlRoundTrips) {
  Config a = Config::parse("top = 1\n[s]\nf = 0.1\nl = [\"a b\", \"c\"]\n[s.t]\nb = false\ne = []\n");
  const Config b = Config::parse(a.to_toml());
  EXPECT_EQ(a.to_toml(), b.to_toml());
  EXPECT_DOUBLE_EQ(b.get<double>("s.f"), 0.1);
  EXPECT_FALSE(b.get<bool>("s.t.b"));
}

TEST(Config, SubIsAViewAndSetCreatesTables) {
  Config c;
  c.set("a.b.c", std::int64_t{5}, "test");
  EXPECT_EQ(c.sub("a").get<std::int64_t>("b.c"), 5);
  EXPECT_EQ(c.origin("a.b.c"), "test");
  EXPECT_TRUE(c.erase("a.b.c"));
  EXPECT_FALSE(c.has("a.b.c"));
}

}  // namespace
TEST(Config, TextThatIsNotUtf8IsAnErrorNamingLineAndColumn) {
  // Inside a literal string this once made toml11 read out of bounds (found by the fuzzer).
  try {
    Config::parse("a = 1\nkey = 'x\xe4rz'\n", "r.toml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("r.toml:2: invalid UTF-8 at column 9"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Config::parse("name = '\xc3\xa9t\xc3\xa9'\n", "ok.toml"));  // valid UTF-8: été
}

}  // namespace trainer
