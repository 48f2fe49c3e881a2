#include "admission.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "trainer/memory.h"

namespace trainer::tune {

Admission admit_trial(const MemoryEstimate& e, const TrialShape& shape) {
  Admission a;
  const std::string kSkip = "predicted out of memory: ";
  if (e.peak == 0) {
    a.run = false;
    a.reason = kSkip + "the smallest probe ran out of memory";
    return a;
  }
  const std::string usable =
      format_bytes(static_cast<std::int64_t>(double(e.limit) * (1.0 - e.margin))) + " usable (" + e.limit_source + ")";
  std::int64_t micro = shape.micro;
  std::optional<LadderConfig> rung;  // where on the ladder the trial starts, beyond the micro-batch
  if (!e.fits_at(shape.batch, micro)) {
    std::ostringstream why;
    why << format_bytes(e.limit_on_reserved ? e.predict_reserved(shape.batch, micro) : e.predict(shape.batch, micro))
        << " at batch " << shape.batch << ", micro-batch " << micro
        << (e.length > 0 ? ", length " + std::to_string(e.length) : std::string()) << " > " << usable;
    // The largest micro-batch predicted to fit at this batch, if oom_backoff could reach it:
    // the trial starts there instead of failing into it.
    std::int64_t m = 0;
    for (std::int64_t k = micro - 1; shape.backoff_floor > 0 && k >= shape.backoff_floor && m == 0; --k) {
      if (e.fits_at(shape.batch, k)) m = k;
    }
    // Else, with oom_backoff, the cheapest configuration on its ladder that fits: the trial
    // starts there (climbed down when memory frees up, as a rung taken).
    const auto c =
        m == 0 && shape.backoff_floor > 0 ? e.cheapest_fit(shape.batch, micro, shape.backoff_floor) : std::nullopt;
    if (m > 0) {
      a.overrides.push_back("training.micro_batch_size=" + std::to_string(m));
      a.reason = "micro-batch " + std::to_string(micro) + " -> " + std::to_string(m) + " (" + why.str() + ")";
      micro = m;
    } else if (c && (c->checkpointed_blocks > 0 || c->moment_bits > 0 || c->offload)) {
      if (c->micro_batch != micro) a.overrides.push_back("training.micro_batch_size=" + std::to_string(c->micro_batch));
      if (c->checkpointed_blocks > 0) {
        a.overrides.push_back("plugins.oom_backoff.start_checkpointed_blocks=" +
                              std::to_string(c->checkpointed_blocks));
      }
      if (c->moment_bits > 0)
        a.overrides.push_back("plugins.oom_backoff.start_moment_bits=" + std::to_string(c->moment_bits));
      if (c->offload) a.overrides.push_back("plugins.oom_backoff.start_offload=true");
      a.reason = "on the ladder: " + describe_config(e, *c) + ", " + ratio_text(c->time_ratio) + " (" + why.str() + ")";
      micro = c->micro_batch;
      rung = c;
    } else {
      a.run = false;
      a.reason = kSkip + why.str();
      a.predicted_peak = e.predict(shape.batch, micro);
      return a;
    }
  }
  std::int64_t eval_batch = shape.eval_batch;
  if (eval_batch > 0 && !e.eval_fits_at(eval_batch)) {
    std::int64_t b = e.max_eval_batch();
    const std::string why = "evaluation " + format_bytes(e.predict_eval(eval_batch)) + " at eval.batch_size " +
                            std::to_string(eval_batch) + " > " + usable;
    if (b < 1) {
      a.run = false;
      a.reason = kSkip + why + ", and at eval.batch_size 1";
      a.predicted_peak = std::max(rung ? rung->peak : e.predict(shape.batch, micro), e.predict_eval(eval_batch));
      return a;
    }
    std::string limit;
    if (shape.eval_limit_batches > 0) {
      // The same samples: limit_batches x batch_size of them, in batches that divide them.
      const std::int64_t samples = shape.eval_limit_batches * eval_batch;
      while (samples % b != 0) --b;
      limit = "eval.limit_batches=" + std::to_string(samples / b);
    }
    a.overrides.push_back("eval.batch_size=" + std::to_string(b));
    if (!limit.empty()) a.overrides.push_back(limit);
    a.reason += (a.reason.empty() ? "" : "; ") + std::string("eval.batch_size ") + std::to_string(eval_batch) + " -> " +
                std::to_string(b) + (limit.empty() ? "" : ", " + limit) + " (" + why + ")";
    eval_batch = b;
  }
  a.predicted_peak = std::max(rung ? rung->peak : e.predict(shape.batch, micro), e.predict_eval(eval_batch));
  return a;
}

}  // namespace trainer::tune
