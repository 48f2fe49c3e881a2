#include "trial_outcome.h"

#include <limits>
#include <regex>

#include "trainer/config.h"
#include "trainer/core_settings.h"

namespace trainer::tune {

using json = nlohmann::json;

std::optional<double> metric_value(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (!v.is_string()) return std::nullopt;
  const std::string s = v.get<std::string>();
  if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (s == "Infinity") return std::numeric_limits<double>::infinity();
  if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

std::map<std::string, std::string> oom_details(const std::string& run_dir, const RunStatusRecord& status) {
  std::map<std::string, std::string> d;
  const std::string& message = status.message;
  std::smatch m;
  if (status.oom_phase) d["phase"] = oom_phase_name(*status.oom_phase);
  if (std::regex_search(message, m, std::regex("with micro-batches ([0-9 >-]+)"))) {
    std::string list = m[1];
    const auto last = list.find_last_of("0123456789");
    const auto first = list.find_last_not_of("0123456789", last);
    d["micro_batch_size"] = list.substr(first == std::string::npos ? 0 : first + 1,
                                        last - (first == std::string::npos ? 0 : first + 1) + 1);
  }
  try {
    const Config c = Config::parse_file(run_dir + "/config.toml");
    if (c.has("model.name")) d["model"] = c.get<std::string>("model.name");
    if (c.has("dataset.name")) d["dataset"] = c.get<std::string>("dataset.name");
    const auto t = TrainingSettings::from(c.sub("training"));
    d["batch_size"] = std::to_string(t.batch_size);  // the effective batch: samples per optimizer step
    if (!d.count("micro_batch_size")) d["micro_batch_size"] = std::to_string(t.micro_batch());
    for (const char* k : {"dataset.image_size", "dataset.resize", "dataset.crop_size", "model.image_size",
                          "model.seq_len", "model.sequence_length"}) {
      if (c.has(k) && !c.is_table(k)) d[k] = config_value_to_toml(c.value(k));
    }
  } catch (const std::exception&) {
    // The run may have died before writing config.toml; the message is all there is.
  }
  return d;
}

}  // namespace trainer::tune
