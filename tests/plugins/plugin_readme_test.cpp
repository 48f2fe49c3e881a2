// The config-key table in each shipped plugin's README is the plugin's KeySpec list, as
// `trainer plugins --markdown` prints it: a key added, renamed or re-documented in the code
// fails here until the README says the same.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/test_util.h"
#include "trainer/config_spec.h"
#include "trainer/plugin_host.h"

namespace trainer {
namespace {

TEST(PluginReadme, KeyTablesMatchTheKeySpecs) {
  int checked = 0;
  for (const auto& dir : std::filesystem::directory_iterator(std::string(TRAINER_SOURCE_DIR) + "/plugins")) {
    if (!dir.is_directory()) continue;
    const std::string name = dir.path().filename().string();
    const std::string readme = testing::read_file((dir.path() / "README.md").string());
    ASSERT_FALSE(readme.empty()) << "plugins/" << name << "/README.md is missing";
    const auto plugin = PluginHost({TRAINER_BUILD_PLUGIN_DIR}).load(name);
    const std::string table = key_table_markdown(plugin->config_keys(), "plugins." + name + ".");
    EXPECT_NE(readme.find(table), std::string::npos)
        << "plugins/" << name << "/README.md lacks its key table; paste it from "
        << "`trainer plugins --markdown`:\n"
        << table;
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

}  // namespace
}  // namespace trainer
