#include "train/evaluate.h"
#include "memory/backend.h"

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
#include "trainer/evaluation.h"
#include "trainer/memory.h"

namespace trainer {

namespace {

/// The evaluator whose EvalMetrics is being dispatched on this thread (evaluate_now()).
thread_local Evaluator* t_evaluating = nullptr;

/// A c10::Error's message without its C++ backtrace; what() for any other exception.
std::string c10_message(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

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
  for (const auto& [name, value] : evaluate(/*events=*/true)) m["eval/" + name] = value;
  {
    // Plugins add their metrics (computed from the batches they saw, or by evaluate_now());
    // all are logged together.
    t_evaluating = this;
    struct Reset {
      ~Reset() { t_evaluating = nullptr; }
    } reset;
    hooks_.fire(Event::EvalMetrics, EventArgs::evaluated(m));
  }
  metrics_.log(state_.global_step, m);
  last_ = {state_.global_step, m};
  hooks_.fire(Event::EvalEnd, EventArgs::evaluated(m));
  return m;
}

std::map<std::string, double> Evaluator::evaluate(bool events) {
  detail::MemoryTagScope other(MemoryCategory::Other, 0);  // its passes count as Evaluation; this comes back after
  const std::int64_t n = limit_ > 0 ? std::min(limit_, parts_.test_set->size()) : parts_.test_set->size();
  // In a data-parallel run each rank evaluates its part of the samples; the sums are added up
  // after, so the metrics are those of one process evaluating them all.
  std::int64_t first = 0, last = n;
  if (parts_.group) std::tie(first, last) = shard_range(n, parts_.group->rank(), parts_.group->size());
  // One row of the task's statistics per evaluated sample, in sample order (kept between
  // evaluations): a retry rewrites the same rows, and in a data-parallel run each rank writes
  // its own and the tables are added up (zeros elsewhere), so every sample counts once.
  const Task& task = *parts_.task;
  if (!rows_.defined() || rows_.size(0) != n || rows_.size(1) != task.eval_width()) {
    rows_ = at::zeros({n, task.eval_width()}, at::kDouble);
  } else {
    rows_.zero_();
  }
  std::optional<std::string> gave_up;  // this rank's out-of-memory give-up, in a data-parallel run
  std::int64_t gave_up_at = 0;         // the last micro-batch it tried
  {
    EvalMode eval_mode(*parts_.model);
    const bool per_batch = events && (hooks_.wants(Event::EvalBatchStart) || hooks_.wants(Event::EvalBatchEnd));
    const auto pass = [&](std::int64_t batch) {
      // Every attempt tells the plugins it starts again: a retried evaluation counts each
      // sample once (its rows are rewritten).
      oom_.enter(OomPhase::Eval);
      if (events) hooks_.fire(Event::EvalStart);
      at::NoGradGuard no_grad;
      for (std::int64_t begin = first, len = 0; begin < last; begin += len) {  // += len: no begin + batch to overflow
        len = std::min(batch, last - begin);
        const at::Tensor idx = at::arange(begin, begin + len, at::kLong);
        const Batch host = parts_.test_set->get(idx);
        const Batch b = to_device(parts_, host);
        if (per_batch) hooks_.fire(Event::EvalBatchStart, EventArgs::micro_batch(b, idx));
        at::Tensor out, rows;
        {
          // The same forward scopes as in training (autocast): evaluation runs at the training precision.
          const auto scopes = hooks_.forward_scopes(Event::EvalBatchStart, EventArgs::micro_batch(b, idx));
          out = parts_.model->forward(b.inputs);
          check_outputs(out, task);
          rows = task.eval_rows(out, b.targets);
        }
        TRAINER_CHECK(rows.dim() == 2 && rows.size(0) == len && rows.size(1) == task.eval_width(), "task '",
                      parts_.task_name, "': eval_rows gave ", rows.sizes(), " for ", len,
                      " samples; its eval_width() is ", task.eval_width());
        rows_.narrow(0, begin, len).copy_(rows);
        if (per_batch) {
          // The batch's loss as eval/loss counts it: weighted by the task's sample weights.
          const at::Tensor w = task.sample_weights(b.targets);
          const at::Tensor losses = rows.select(1, 0);
          const at::Tensor mean = (w.defined() ? (losses * w.to(losses.device(), at::kDouble)).sum() /
                                                     w.to(at::kDouble).sum().clamp_min(1e-300)
                                               : losses.mean())
                                      .to(at::kFloat);
          hooks_.fire(Event::EvalBatchEnd, EventArgs::micro_batch(b, idx, &out, &mean));
        }
      }
    };
    std::optional<std::int64_t> settled;
    try {
      if (events) {
        settled = oom_.retry(OomRetry::AskPlugins, parts_.eval_batch, std::max<std::int64_t>(1, last - first), pass);
      } else {
        // evaluate_now(), from an EvalMetrics handler: at the batch the evaluation settled on,
        // no retry (the plugins are being asked about something else).
        try {
          pass(parts_.eval_batch);
        } catch (const std::exception& e) {
          if (!is_out_of_memory(e)) throw;
          throw OomFailure(
              fmt::format("out of memory evaluating again at eval batch {}: {}", parts_.eval_batch, c10_message(e)),
              OomPhase::Eval, parts_.eval_batch);
        }
      }
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
    std::vector<at::Tensor> flags{at::zeros({ranks}, at::kDouble)};
    flags[0].data_ptr<double>()[parts_.group->rank()] = gave_up ? 1.0 : 0.0;
    parts_.group->all_reduce_sum(flags);
    if (gave_up) throw OomFailure(*gave_up, OomPhase::Eval, gave_up_at);
    for (std::int64_t r = 0; r < ranks; ++r) {
      if (flags[0].data_ptr<double>()[r] > 0) {
        throw OomFailure(
            fmt::format("rank {} ran out of memory in eval and gave up (its log says what was tried); every rank stops",
                        r),
            OomPhase::Eval);
      }
    }
    std::vector<at::Tensor> table{rows_};
    parts_.group->all_reduce_sum(table);
  }
  std::map<std::string, double> m = task.evaluate(rows_);
  // The mean of the samples' losses, unless the task weighs them (Task::evaluate).
  if (!m.count("loss")) m["loss"] = n > 0 ? rows_.select(1, 0).sum().item<double>() / double(n) : 0.0;
  return m;
}

std::map<std::string, double> evaluate_now() {
  TRAINER_CHECK(t_evaluating,
                "trainer::evaluate_now() is for a plugin's EvalMetrics handler only (it evaluates the "
                "model as it is then, on the samples of that evaluation)");
  Evaluator* e = t_evaluating;
  t_evaluating = nullptr;  // not again from within
  struct Restore {
    Evaluator* e;
    ~Restore() { t_evaluating = e; }
  } restore{e};
  return e->evaluate(/*events=*/false);
}

}  // namespace trainer
