#include "trainer/core_settings.h"
#include "dist/dist_settings.h"

#include "trainer/data.h"
#include "trainer/model.h"
#include "trainer/optim.h"
#include "trainer/task.h"

namespace trainer {

std::vector<SectionSpec> core_config_sections(const Config& cfg) {
  std::vector<SectionSpec> s = {
      {"run", RunSettings::keys(), "Run identity"},
      {"training", TrainingSettings::keys(), "The training loop"},
      {"eval", EvalSettings::keys(), "Evaluation on the test split"},
      {"checkpoint", CheckpointSettings::keys(), "Checkpoints"},
      {"runtime", RuntimeSettings::keys(), "Process settings"},
      {"loader", LoaderSettings::keys(), "Reading training batches ahead of the step"},
      {"memory", MemorySettings::keys(), "Memory"},
      {"metrics", MetricsSettings::keys(), "Metric sinks"},
      {"plugins", PluginsSettings::keys(), "Plugins"},
      {"distributed", DistributedSettings::keys(), "Data-parallel runs (torchrun, trainer launch)"},
  };

  // A registry-backed section: `name` (one of the registry's entries; required when there is
  // no fallback), the keys every entry shares (`common`), then the chosen entry's own keys.
  // `neutral_choice`: which entry is chosen does not change memory (the schedule).
  auto named_section = [&](const std::string& path, const auto& registry, const std::string& fallback,
                           const std::vector<KeySpec>& common, const std::string& doc, bool neutral_choice = false) {
    SectionSpec sec{path, {}, doc};
    KeySpec name("name", ValueType::String, "Which " + registry.kind() + " to use");
    name.choices(registry.names());
    if (neutral_choice) name.memory_neutral();
    if (fallback.empty()) {
      name.required();
    } else {
      name.def(fallback);
    }
    sec.keys.push_back(name);
    sec.keys.insert(sec.keys.end(), common.begin(), common.end());
    std::string chosen = fallback;
    if (cfg.has(path + ".name") && !cfg.is_table(path + ".name")) {
      if (const auto* v = std::get_if<std::string>(&cfg.value(path + ".name"))) chosen = *v;
    }
    if (!chosen.empty() && registry.contains(chosen)) {
      for (const auto& k : registry.get(chosen).keys) sec.keys.push_back(k);
    }
    s.push_back(sec);
  };
  named_section("model", model_registry(), "", ModelSettings::keys(), "The model");
  named_section("dataset", dataset_registry(), "", {}, "The dataset");
  named_section("optim", optimizer_registry(), "adamw", {}, "The optimizer");
  named_section("sched", schedule_registry(), "constant", {}, "The learning-rate schedule", true);
  named_section("task", task_registry(), "classification", {}, "What the model learns: its loss and metrics");
  return s;
}

}  // namespace trainer
