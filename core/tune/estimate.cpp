#include "estimate.h"

#include <c10/core/Device.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "estimate_internal.h"
#include "trainer/core_settings.h"
#include "trainer/error.h"
#include "trainer/plugin.h"
#include "trainer/recipe.h"

namespace trainer::tune {

RecipeFacts recipe_facts(const EstimateRequest& r) {
  const PreparedRun p = prepare_run(r.recipe, r.overrides, r.plugin_dirs);
  RecipeFacts f;
  const auto t = TrainingSettings::from(p.config.sub("training"));
  f.batch = t.batch_size;
  f.micro = t.micro_batch();
  f.memory = MemorySettings::from(p.config.sub("memory"));
  const auto eval = EvalSettings::from(p.config.sub("eval"));
  if (eval.evaluates()) f.eval_batch = eval.batch_size;
  f.memory_format_auto =
      p.config.has("model.memory_format") && p.config.get<std::string>("model.memory_format") == "auto";
  if (p.config.has("dataset.max_length")) f.max_length = p.config.get<std::int64_t>("dataset.max_length");
  f.model_trims = p.config.has("model.trim_padding");
  if (std::any_of(p.plugins.begin(), p.plugins.end(), [](const auto& x) { return x->name() == "oom_backoff"; })) {
    // The resolved config has the plugin's defaults (ladder ["auto"], allow_inexact false).
    const auto ladder = p.config.get<std::vector<std::string>>("plugins.oom_backoff.ladder");
    const bool inexact = p.config.get<bool>("plugins.oom_backoff.allow_inexact");
    const auto has = [&ladder](const char* rung) {
      return std::find(ladder.begin(), ladder.end(), "auto") != ladder.end() ||
             std::find(ladder.begin(), ladder.end(), rung) != ladder.end();
    };
    f.rung_checkpoint = has("checkpoint");
    f.rung_bf16 = inexact && has("optimizer_bf16");
    f.rung_8bit = inexact && has("optimizer_8bit");
    f.rung_offload = has("offload");
    f.min_micro_batch = p.config.get<std::int64_t>("plugins.oom_backoff.min_micro_batch");
  }
  return f;
}

std::vector<std::string> length_overrides(std::int64_t len, const RecipeFacts& facts) {
  if (len <= 0) return {};
  std::vector<std::string> o = {"dataset.max_length=" + std::to_string(len), "dataset.padding=\"max_length\""};
  if (facts.model_trims) o.emplace_back("model.trim_padding=false");
  return o;
}

std::int64_t usable(const MemoryEstimate& e) {
  return static_cast<std::int64_t>(static_cast<double>(e.limit) * (1.0 - e.margin));
}

std::int64_t limit_measure(const MemoryEstimate& e, std::int64_t batch, std::int64_t micro, std::int64_t len) {
  return e.limit_on_reserved ? e.predict_reserved_at(batch, micro, len) : e.predict_at(batch, micro, len);
}

std::int64_t limit_measure(const MemoryEstimate& e, std::int64_t batch, std::int64_t micro) {
  return limit_measure(e, batch, micro, e.length);
}

std::string memory_key(const std::vector<std::string>& overrides, const std::vector<SectionSpec>& sections) {
  const auto neutral = [&](const std::string& o) {
    std::string key = o.substr(0, o.find('='));
    if (!key.empty() && key[0] == '+') key.erase(0, 1);
    for (const auto& sec : sections) {
      if (key.size() <= sec.path.size() + 1 || key.compare(0, sec.path.size() + 1, sec.path + ".") != 0) continue;
      const std::string rest = key.substr(sec.path.size() + 1);
      for (const auto& k : sec.keys) {
        if (k.key == rest) return k.is_memory_neutral;
      }
    }
    return false;
  };
  std::string key;
  for (const auto& o : overrides) {
    if (!neutral(o)) key += o + "\n";
  }
  return key;
}

std::string memory_key(const std::vector<std::string>& overrides, const PreparedRun& run) {
  std::vector<SectionSpec> sections = core_config_sections(run.config);
  const auto plugin_sections = plugin_config_sections(run.plugins);
  sections.insert(sections.end(), plugin_sections.begin(), plugin_sections.end());
  return memory_key(overrides, sections);
}

std::int64_t MemoryEstimate::predict_at(std::int64_t batch, std::int64_t micro, std::int64_t len) const {
  micro = std::min(micro, batch);
  const double l = double(len);
  const double sample = per_sample + per_sample_l1 * l + per_sample_l2 * l * l;
  const double forward_backward = std::max(
      floor, held + sample * double(micro) + (per_batch_sample + per_batch_sample_l1 * l) * double(batch - micro));
  const double step = step_held + (step_per_batch_sample + step_per_batch_sample_l1 * l) * double(batch);
  return static_cast<std::int64_t>(std::llround(std::max(forward_backward, step)));
}

std::int64_t MemoryEstimate::predict_reserved_at(std::int64_t batch, std::int64_t micro, std::int64_t len) const {
  micro = std::min(micro, batch);
  return predict_at(batch, micro, len) +
         std::max<std::int64_t>(0, std::llround(slack + (slack_per_sample + slack_l1 * double(len)) * double(micro)));
}

bool MemoryEstimate::fits_at(std::int64_t batch, std::int64_t micro) const {
  return fits_at_length(batch, micro, length);
}

bool MemoryEstimate::fits_at_length(std::int64_t batch, std::int64_t micro, std::int64_t len) const {
  return limit <= 0 || limit_measure(*this, batch, micro, len) <= usable(*this);
}

std::int64_t MemoryEstimate::predict_eval_at(std::int64_t batch, std::int64_t len) const {
  if (eval_batch <= 0) return 0;
  const double samples = double(test_samples > 0 ? std::min(batch, test_samples) : batch);
  const double l = double(len);
  return static_cast<std::int64_t>(
      std::llround(eval_base + (eval_per_sample + eval_per_sample_l1 * l + eval_per_sample_l2 * l * l) * samples));
}

bool MemoryEstimate::eval_fits_at(std::int64_t batch) const {
  if (eval_batch <= 0 || limit <= 0) return true;
  const std::int64_t reserve_slack = limit_on_reserved ? std::max<std::int64_t>(0, std::llround(slack)) : 0;
  return predict_eval(batch) + reserve_slack <= usable(*this);
}

std::int64_t MemoryEstimate::max_eval_batch() const {
  if (eval_batch <= 0 || limit <= 0) return -1;
  if (!eval_fits_at(1)) return 0;
  const double l = double(length);
  const double per_sample = eval_per_sample + eval_per_sample_l1 * l + eval_per_sample_l2 * l * l;
  if (per_sample <= 0) return std::max<std::int64_t>(1, test_samples);
  // Linear in the batch: the largest b with base + per_sample * b inside, checked around it
  // for rounding.
  std::int64_t b = static_cast<std::int64_t>((double(usable(*this)) - eval_base) / per_sample);
  b = std::max<std::int64_t>(1, b + 1);
  while (b > 1 && !eval_fits_at(b)) --b;
  return b;
}

std::vector<std::int64_t> default_probe_sizes(std::int64_t micro) {
  // Never above the recipe's own micro-batch: a probe larger than it could run out of memory
  // where the recipe would not.
  const std::int64_t top = std::min(std::max<std::int64_t>(4, micro / 4), std::max<std::int64_t>(2, micro));
  return {std::max<std::int64_t>(1, top / 4), std::max<std::int64_t>(2, top / 2), top};
}
void find_max_batch(const EstimateRequest& request, MemoryEstimate& e) {
  const RecipeFacts facts = recipe_facts(request);
  const c10::Device device(e.device.empty() ? "cpu" : e.device);
  TRAINER_CHECK_T(UsageError, device.is_cuda() || facts.memory.limit_mb > 0 || facts.memory.fraction > 0,
                  "--find-max-batch on the CPU needs a budget (memory.limit_mb or memory.fraction): without one "
                  "the search would run the host out of memory");
  const std::int64_t cap = std::max<std::int64_t>(1, e.train_samples);
  // A step "fits" when it ran its steps with no out-of-memory error, inside the run's budget.
  const auto runs = [&](std::int64_t m) {
    ShortRunSpec spec;
    spec.recipe = request.recipe;
    spec.overrides = request.overrides;
    spec.overrides.insert(spec.overrides.end(), e.probe_overrides.begin(), e.probe_overrides.end());
    // With a length axis, at the recipe's length as predicted: every batch that long.
    const auto at_length = length_overrides(e.length, facts);
    spec.overrides.insert(spec.overrides.end(), at_length.begin(), at_length.end());
    spec.plugin_dirs = request.plugin_dirs;
    spec.batch_size = m;
    spec.micro_batch = m;
    spec.steps = request.probe_steps;
    spec.keep_budget = true;
    spec.work_dir = request.work_dir;
    spec.label = "estimate-search-" + std::to_string(m);
    const ShortRunResult r = run_short(spec);
    const bool ok = r.exit_code == 0 && !r.out_of_memory;
    TRAINER_CHECK(ok || r.out_of_memory, "the search step at micro-batch ", m, " failed: ", r.message);
    e.search.emplace_back(m, ok);
    return ok;
  };
  // Bracket the largest size around the prediction (made without the margin), then bisect.
  // Without a fit (the probes ran out of memory), from the largest probe that ran, else 1.
  std::int64_t ran = 1;
  for (const auto& p : e.probes) {
    if (p.error.empty() && p.batch_size == p.micro_batch) ran = std::max(ran, p.micro_batch);
  }
  std::int64_t start =
      e.peak == 0 ? ran
                  : std::clamp<std::int64_t>(
                        largest_fitting([&](std::int64_t m) { return limit_measure(e, m, m); }, e.limit, cap), 1, cap);
  std::int64_t lo = 0, hi = cap + 1;  // lo fits (0: none known), hi does not (cap + 1: none known)
  if (runs(start)) {
    lo = start;
    for (std::int64_t m = start; lo == m && m < cap;) {
      m = std::min(cap, std::max(m + 1, m + m / 8));
      if (runs(m))
        lo = m;
      else
        hi = m;
    }
  } else {
    hi = start;
    for (std::int64_t m = start; hi == m && m > 1;) {
      m = std::max<std::int64_t>(1, std::min(m - 1, m - m / 8));
      if (runs(m))
        lo = m;
      else
        hi = m;
    }
  }
  while (lo > 0 && hi <= cap && hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (runs(mid) ? lo : hi) = mid;
  }
  e.found_max_micro_batch = lo;
}

}  // namespace trainer::tune
