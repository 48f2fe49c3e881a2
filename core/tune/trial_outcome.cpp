#include "trial_outcome.h"

#include "trainer/config.h"
#include "trainer/core_settings.h"

namespace trainer::tune {

std::map<std::string, std::string> oom_details(const std::string& run_dir, const RunStatusRecord& status) {
  std::map<std::string, std::string> d;
  if (status.oom_phase) d["phase"] = oom_phase_name(*status.oom_phase);
  if (status.micro_batch > 0) d["micro_batch_size"] = std::to_string(status.micro_batch);
  try {
    const Config c = Config::parse_file(run_dir + "/config.toml");
    if (c.has("model.name")) d["model"] = c.get<std::string>("model.name");
    if (c.has("dataset.name")) d["dataset"] = c.get<std::string>("dataset.name");
    const auto t = TrainingSettings::from(c.sub("training"));
    d["batch_size"] = std::to_string(t.batch_size);  // the effective batch: samples per optimizer step
    if (!d.count("micro_batch_size")) d["micro_batch_size"] = std::to_string(t.micro_batch());
    // Micro-batches per optimizer step at the micro-batch that ran out of memory.
    const std::int64_t micro = std::stoll(d["micro_batch_size"]);
    if (micro > 0) d["accumulation"] = std::to_string((t.batch_size + micro - 1) / micro);
    for (const char* k : {"dataset.image_size", "dataset.resize", "dataset.crop_size", "dataset.max_length",
                          "model.image_size", "model.seq_len", "model.sequence_length"}) {
      if (c.has(k) && !c.is_table(k)) d[k] = config_value_to_toml(c.value(k));
    }
  } catch (const std::exception&) {
    // The run may have died before writing config.toml; status.json is all there is.
  }
  return d;
}

}  // namespace trainer::tune
