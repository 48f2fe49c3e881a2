// libFuzzer target for the recipe and override parser: recipe text and command-line
// overrides in; out comes a validated config, or trainer's config errors (UsageError: what
// the CLI reports with exit code 2). Anything else (a crash, a hang, a sanitizer finding, any
// other exception) is a finding.
//
// An input is the recipe's TOML text, then optionally a NUL byte and the overrides, one per
// line (`training.epochs=3`, `+optim.lr=1e999`, `model=cnn`, a preset name).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "trainer/error.h"
#include "trainer/recipe.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string text = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    std::size_t at = nul + 1;
    while (at <= input.size()) {
      const std::size_t end = std::min(input.find('\n', at), input.size());
      if (end > at) overrides.push_back(input.substr(at, end - at));
      at = end + 1;
    }
  }
  // Recipes are files (their directory is where config groups are searched).
  static const std::string path = "/tmp/trainer-recipe-fuzz-" + std::to_string(::getpid()) + ".toml";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  try {
    trainer::LoadedRecipe recipe = trainer::load_recipe(path, overrides);
    trainer::validate_recipe(recipe);
    (void)recipe.config.to_toml();  // what --print-config and config.toml print
  } catch (const trainer::UsageError&) {
    // A config error, reported to the user with exit code 2: the expected outcome.
  }
  return 0;
}
