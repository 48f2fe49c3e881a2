#include "trainer/plugin_host.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "trainer/error.h"

namespace trainer {
namespace {

TEST(PluginHost, LoadsARealPluginByName) {
  PluginHost host({TRAINER_TEST_PLUGIN_DIR});
  auto p = host.load("recording");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name(), "recording");
  EXPECT_EQ(p->events().size(), kNumEvents);
}

TEST(PluginHost, LoadsByPath) {
  PluginHost host;
  auto p = host.load(std::string(TRAINER_TEST_PLUGIN_DIR) + "/libtrainer_plugin_throwing.so");
  EXPECT_EQ(p->name(), "throwing");
}

TEST(PluginHost, NotFoundListsEveryDirectorySearched) {
  PluginHost host({"/nonexistent/a", "/nonexistent/b"});
  try {
    host.load("nosuch");
    FAIL();
  } catch (const PluginError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("plugin 'nosuch' not found"), std::string::npos) << msg;
    EXPECT_NE(msg.find("libtrainer_plugin_nosuch.so"), std::string::npos) << msg;
    for (const auto& d : host.search_path()) EXPECT_NE(msg.find(d), std::string::npos) << d;
    EXPECT_NE(msg.find("/nonexistent/a, /nonexistent/b"), std::string::npos) << msg;
  }
}

TEST(PluginHost, NotFoundSuggestsTheClosestLibraryPresent) {
  PluginHost host({TRAINER_TEST_PLUGIN_DIR});
  try {
    host.load("recordin");
    FAIL();
  } catch (const PluginError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("plugin 'recordin' not found"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean 'recording'?"), std::string::npos) << msg;
    EXPECT_NE(msg.find("plugins there: "), std::string::npos) << msg;
  }
  const auto names = host.available();
  EXPECT_NE(std::find(names.begin(), names.end(), "oom_backoff"), names.end());
}

TEST(PluginHost, ABuildTreeLibrarySearchesThatTreesPluginsOnly) {
  // libtrainer_core of this build tree: its plugin directory, nothing installed; an installed
  // library never searches a build directory (tests/install checks that side).
  EXPECT_EQ(default_plugin_dirs(), (std::vector<std::string>{TRAINER_BUILD_PLUGIN_DIR}));
}

TEST(PluginHost, EnvironmentPathComesAfterExplicitDirs) {
  ::setenv("TRAINER_PLUGIN_PATH", "/env/one:/env/two", 1);
  PluginHost host({"/explicit"});
  ::unsetenv("TRAINER_PLUGIN_PATH");
  ASSERT_GE(host.search_path().size(), 3u);
  EXPECT_EQ(host.search_path()[0], "/explicit");
  EXPECT_EQ(host.search_path()[1], "/env/one");
  EXPECT_EQ(host.search_path()[2], "/env/two");
}

TEST(PluginHost, RefusesAnAbiMismatchNamingLibraryAndVersions) {
  PluginHost host({TRAINER_TEST_PLUGIN_DIR});
  try {
    host.load("bad_abi");
    FAIL();
  } catch (const PluginError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("libtrainer_plugin_bad_abi.so"), std::string::npos) << msg;
    EXPECT_NE(msg.find("trainer ABI 999 (plugin) vs " + std::to_string(TRAINER_ABI_VERSION) + " (host)"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(std::string("LibTorch 0.0.1 (plugin) vs ") + TORCH_VERSION + " (host)"), std::string::npos)
        << msg;
  }
}

TEST(PluginHost, RefusesAStructLayoutMismatchUnderTheSameAbiVersion) {
  PluginHost host({TRAINER_TEST_PLUGIN_DIR});
  try {
    host.load("bad_layout");
    FAIL();
  } catch (const PluginError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("libtrainer_plugin_bad_layout.so"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sizeof(EventContext) " + std::to_string(sizeof(EventContext) + 8) + " (plugin) vs " +
                       std::to_string(sizeof(EventContext)) + " (host)"),
              std::string::npos)
        << msg;
  }
}

TEST(PluginHost, AFactoryThrowingANonStandardExceptionIsAPluginError) {
  PluginHost host({TRAINER_TEST_PLUGIN_DIR});
  try {
    host.load("throwing_factory");
    FAIL();
  } catch (const PluginError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("libtrainer_plugin_throwing_factory.so: trainer_plugin_create threw an exception that is not "
                       "a std::exception"),
              std::string::npos)
        << msg;
  }
}

TEST(PluginHost, RefusesALibraryWithoutEntryPoints) {
  PluginHost host({TRAINER_TEST_PLUGIN_DIR});
  try {
    host.load("not_a_plugin");
    FAIL();
  } catch (const PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a trainer plugin"), std::string::npos) << e.what();
  }
}

TEST(PluginHost, DiscoverDescribesPluginsAndReportsBadOnes) {
  PluginHost host({TRAINER_TEST_PLUGIN_DIR});
  std::vector<std::string> errors;
  const auto infos = host.discover(&errors);
  bool found = false;
  for (const auto& i : infos) found |= i.name == "throwing" && !i.keys.empty();
  EXPECT_TRUE(found);
  EXPECT_EQ(errors.size(), 4u);  // bad_abi, bad_layout, not_a_plugin and throwing_factory
}

}  // namespace
}  // namespace trainer
