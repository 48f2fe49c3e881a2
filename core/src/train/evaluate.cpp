#include "train/evaluate.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <optional>
#include <string>
#include <tuple>

#include "dist/shard.h"
#include "train/hooks.h"
#include "train/oom_recovery.h"
#include "train/setup.h"
#include "train/train_metrics.h"

namespace trainer {

namespace {

/// The model in eval mode for the guard's lifetime.
struct EvalMode {
  explicit EvalMode(Model& m) : model(m) { model.eval(); }
  ~EvalMode() { model.train(); }
  Model& model;
};

}  // namespace

Evaluator::Evaluator(const EvalSettings& eval, RunParts& parts, const RunState& state, Hooks& hooks, OomRecovery& oom,
                     MetricsLogger& metrics, TrainMetrics& window)
    : parts_(parts),
      state_(state),
      hooks_(hooks),
      oom_(oom),
      metrics_(metrics),
      window_(window),
      // In samples, fixed by the configured batch: a retry with a smaller batch after an
      // out-of-memory error evaluates the same samples.
      limit_(eval.limit_batches * eval.batch_size) {
  parts_.eval_batch = eval.batch_size;
}

std::map<std::string, double> Evaluator::run() {
  std::map<std::string, double> m;
  if (!parts_.test_set) return m;
  TrainMetrics::Pause pause(window_);
  const std::int64_t n = limit_ > 0 ? std::min(limit_, parts_.test_set->size()) : parts_.test_set->size();
  // In a data-parallel run each rank evaluates its part of the samples; the sums are added up
  // after, so the metrics are those of one process evaluating them all.
  std::int64_t first = 0, last = n;
  if (parts_.group) std::tie(first, last) = shard_range(n, parts_.group->rank(), parts_.group->size());
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  std::optional<std::string> gave_up;  // this rank's out-of-memory give-up, in a data-parallel run
  std::int64_t gave_up_at = 0;         // the last micro-batch it tried
  {
    EvalMode eval_mode(*parts_.model);
    const bool per_batch = hooks_.wants(Event::EvalBatchStart) || hooks_.wants(Event::EvalBatchEnd);
    std::optional<std::int64_t> settled;
    try {
      settled = oom_.retry(
          OomRetry::AskPlugins, parts_.eval_batch, std::max<std::int64_t>(1, last - first), [&](std::int64_t batch) {
            // Every attempt starts from zero, and tells the plugins so: a retried evaluation counts
            // each sample once.
            loss_sum = 0.0;
            correct = 0;
            oom_.enter(OomPhase::Eval);
            hooks_.fire(Event::EvalStart);
            at::NoGradGuard no_grad;
            for (std::int64_t begin = first, len = 0; begin < last;
                 begin += len) {  // += len: no begin + batch to overflow
              len = std::min(batch, last - begin);
              const at::Tensor idx = at::arange(begin, begin + len, at::kLong);
              const Batch host = parts_.test_set->get(idx);
              const Batch b = to_device(parts_, host);
              if (per_batch) hooks_.fire(Event::EvalBatchStart, EventArgs::micro_batch(b, idx));
              at::Tensor out, loss;
              {
                // The same forward scopes as in training (autocast): evaluation runs at the training precision.
                const auto scopes = hooks_.forward_scopes(Event::EvalBatchStart, EventArgs::micro_batch(b, idx));
                out = parts_.model->forward(b.inputs);
                loss = at::cross_entropy_loss(out, b.targets, {}, at::Reduction::Sum);
              }
              loss_sum += loss.item<double>();
              correct += out.argmax(1).eq(b.targets).sum().item<std::int64_t>();
              if (per_batch) {
                const at::Tensor mean = loss / static_cast<double>(len);
                hooks_.fire(Event::EvalBatchEnd, EventArgs::micro_batch(b, idx, &out, &mean));
              }
            }
          });
    } catch (const OomFailure& e) {
      // Each rank retries its own part; one that gives up tells the others in the reduction
      // below, and every rank fails the same way instead of waiting for it.
      if (!parts_.group) throw;
      gave_up = e.what();
      gave_up_at = e.micro_batch;
    }
    if (settled) parts_.eval_batch = *settled;  // later evaluations keep the size that worked
  }
  if (parts_.group) {
    const std::int64_t ranks = parts_.group->size();
    std::vector<at::Tensor> sums{at::zeros({2 + ranks}, at::kDouble)};
    double* s = sums[0].data_ptr<double>();
    s[0] = loss_sum;
    s[1] = static_cast<double>(correct);
    s[2 + parts_.group->rank()] = gave_up ? 1.0 : 0.0;
    parts_.group->all_reduce_sum(sums);
    if (gave_up) throw OomFailure(*gave_up, OomPhase::Eval, gave_up_at);
    for (std::int64_t r = 0; r < ranks; ++r) {
      if (s[2 + r] > 0) {
        throw OomFailure(
            fmt::format("rank {} ran out of memory in eval and gave up (its log says what was tried); every rank stops",
                        r),
            OomPhase::Eval);
      }
    }
    loss_sum = s[0];
    correct = static_cast<std::int64_t>(std::llround(s[1]));
  }
  m["eval/loss"] = loss_sum / double(n);
  m["eval/accuracy"] = double(correct) / double(n);
  // Plugins add their metrics (computed from the batches they saw); all are logged together.
  hooks_.fire(Event::EvalMetrics, EventArgs::evaluated(m));
  metrics_.log(state_.global_step, m);
  hooks_.fire(Event::EvalEnd, EventArgs::evaluated(m));
  return m;
}

}  // namespace trainer
