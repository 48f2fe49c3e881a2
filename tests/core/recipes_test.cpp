// Every shipped recipe and config group loads and validates.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/test_util.h"
#include "trainer/recipe.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

TEST(Recipes, EveryRecipeValidatesAndOpensWithItsCommand) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(TRAINER_SOURCE_DIR) / "recipes")) {
    if (e.path().extension() != ".toml") continue;
    ++n;
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(prepare_run(e.path().string(), {}, {TRAINER_TEST_PLUGIN_DIR}));
    const std::string text = testing::read_file(e.path().string());
    EXPECT_EQ(text.rfind("#", 0), 0u) << "a recipe opens with a comment";
    EXPECT_NE(text.find("--recipe recipes/" + e.path().filename().string()), std::string::npos)
        << "the comment shows the command";
  }
  EXPECT_GT(n, 0);
}

TEST(Recipes, EveryConfigGroupValidates) {
  const fs::path configs = fs::path(TRAINER_SOURCE_DIR) / "configs";
  testing::TempDir tmp;
  int n = 0;
  for (const auto& group : fs::directory_iterator(configs)) {
    if (!group.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(group.path())) {
      ++n;
      const std::string name = group.path().filename().string() + "/" + f.path().stem().string();
      SCOPED_TRACE(name);
      // Fill the other required groups so the group under test is validated on its own.
      std::string defaults = "\"" + name + "\"";
      for (const char* g : {"model/mlp", "dataset/synthetic", "optim/sgd"}) {
        if (std::string(g).rfind(group.path().filename().string() + "/", 0) != 0)
          defaults += std::string(", \"") + g + "\"";
      }
      testing::write_file(tmp / "r.toml", "defaults = [" + defaults + "]\n");
      auto r = load_recipe(tmp / "r.toml", {}, {configs.string()});
      EXPECT_NO_THROW(validate_recipe(r));
    }
  }
  EXPECT_GT(n, 0);
}

TEST(Recipes, EveryPresetAppliesToTheMainRecipe) {
  const fs::path configs = fs::path(TRAINER_SOURCE_DIR) / "configs";
  for (const auto& f : fs::directory_iterator(configs)) {
    if (f.path().extension() != ".toml") continue;
    SCOPED_TRACE(f.path().string());
    EXPECT_NO_THROW(prepare_run(std::string(TRAINER_SOURCE_DIR) + "/recipes/fashion_mnist.toml",
                                {f.path().stem().string()}, {TRAINER_TEST_PLUGIN_DIR}));
  }
}

}  // namespace
}  // namespace trainer
