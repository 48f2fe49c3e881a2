#include "train/step.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>

#include "dist/rank_sync.h"
#include "optim/adamw8bit.h"
#include "train/diverged.h"
#include "train/hooks.h"
#include "train/memory_timeline.h"
#include "train/oom_recovery.h"
#include "train/setup.h"
#include "train/train_metrics.h"
#include "trainer/distributed.h"
#include "trainer/loader.h"
#include "trainer/optim.h"
#include "util/error_text.h"

namespace trainer {

std::unique_ptr<StepSync> make_step_sync(RunParts& parts, Hooks& hooks, OomRecovery& oom, TrainMetrics& metrics,
                                         spdlog::logger& log) {
  if (!parts.group) return std::make_unique<LocalSync>();
  return std::make_unique<RankGroupSync>(*parts.group, *parts.model, parts.task->train_width(), parts.bucket_bytes,
                                         parts.overlap, hooks.wants(Event::AfterBackward), oom, metrics, log);
}

TrainStep::TrainStep(const TrainingSettings& training, RunParts& parts, RunState& state, Hooks& hooks, OomRecovery& oom,
                     TrainMetrics& metrics, spdlog::logger& log)
    : training_(training),
      parts_(parts),
      state_(state),
      hooks_(hooks),
      oom_(oom),
      metrics_(metrics),
      log_(log),
      micro_batch_(training.micro_batch()),
      skipped_(training.on_nonfinite == "skip_step" ? training.max_skipped_steps : 0) {
  sync_ = make_step_sync(parts_, hooks_, oom_, metrics_, log_);
}

TrainStep::~TrainStep() = default;

bool TrainStep::run(const at::Tensor& indices, std::int64_t global_size, Position next) {
  detail::MemoryTagScope other(MemoryCategory::Other, 0);  // the phases of the step set theirs; this comes back after
  next_ = next;
  if (!start_batch(indices.size(0))) {
    log_.debug("batch {} skipped at BatchStart", state_.batch_in_epoch);
    advance();
    return false;
  }
  // The loader keeps the batch for a retry of this step; its memory goes when the step does.
  struct ReleaseBatch {
    BatchLoader* loader;
    ~ReleaseBatch() {
      if (loader) loader->release();
    }
  } release{parts_.loader.get()};
  const std::int64_t samples = sync_->attempt_samples(indices.size(0), global_size);
  AttemptResult done;
  const auto settled = oom_.retry(
      OomRetry::AskPlugins, std::max<std::int64_t>(1, std::min(micro_batch_, samples)),
      std::max<std::int64_t>(1, samples), [&](std::int64_t micro) { done = attempt(indices, micro, global_size); },
      sync_->ranks());
  if (settled) micro_batch_ = *settled;  // later batches keep the size that worked (oom_backoff grows it back)
  if (done.skipped) {
    drop_gradients(*parts_.model);
    log_.debug("optimizer step skipped at batch {}", state_.batch_in_epoch);
    advance();
    return false;
  }
  ++state_.global_step;
  state_.samples_seen += global_size;
  advance();
  hooks_.fire(Event::AfterOptimizerStep);
  // The micro-batch a full batch is trained in (this rank's part of it in a rank group), not the
  // size of an epoch's short last batch.
  const std::int64_t full_batch_micro =
      std::min(micro_batch_, sync_->attempt_samples(training_.batch_size, training_.batch_size));
  metrics_.add_step(done.loss, global_size, done.stats, full_batch_micro,
                    training_.grad_clip_norm > 0 ? std::optional<double>(state_.grad_norm) : std::nullopt);
  return true;
}

bool TrainStep::start_batch(std::int64_t n) {
  // BatchStart reports the micro-batch setting; attempts report the size they really use
  // (capped at the batch, which is shorter at the end of an epoch).
  state_.micro_batch_size = micro_batch_;
  state_.num_micro_batches = n / micro_batch_ + (n % micro_batch_ != 0);  // no n + micro - 1 to overflow
  state_.micro_batch_index = 0;
  const Control start = hooks_.fire(Event::BatchStart);
  apply_micro_batch_request(start);
  StepSync::BatchPlan wish;
  wish.checkpointed_blocks = start.checkpointed_blocks.value_or(-1);
  wish.moment_bits = start.optimizer_moment_bits.value_or(0);
  wish.offload = start.optimizer_offload ? (*start.optimizer_offload ? 2 : 1) : 0;
  const StepSync::BatchPlan plan = sync_->start_batch(start.skip_step, micro_batch_, wish);
  micro_batch_ = plan.micro_batch;
  Control savers;
  if (plan.checkpointed_blocks >= 0) savers.checkpointed_blocks = plan.checkpointed_blocks;
  if (plan.moment_bits > 0 || plan.offload > 0) {
    // The last step's gradients are not needed any more (a batch starts from none): the
    // conversion gets their memory.
    drop_gradients(*parts_.model);
    if (plan.moment_bits > 0) savers.optimizer_moment_bits = plan.moment_bits;
    if (plan.offload > 0) savers.optimizer_offload = plan.offload == 2;
  }
  oom_.rungs().apply(savers, start.reason);
  state_.micro_batch_size = micro_batch_;
  return !plan.skip;
}

TrainStep::AttemptResult TrainStep::attempt(const at::Tensor& indices, std::int64_t micro, std::int64_t global_size) {
  state_.micro_batch_size = micro;
  const StepTotals totals =
      sync_->gradients([&] { return forward_backward(indices, micro, global_size); }, global_size);
  state_.loss = totals.loss;
  state_.lr = parts_.schedule->lr_at(state_.global_step);
  state_.grad_norm = 0.0;
  // From here on the memory needed does not depend on the micro-batch.
  oom_.enter(OomPhase::OptimizerStep);
  nonfinite_.clear();
  const StepVerdict verdict = sync_->before_step([&] { return before_optimizer_step(totals.skip); });
  if (verdict == StepVerdict::Diverge) {
    drop_gradients(*parts_.model);
    throw Diverged(fmt::format(
        "training diverged at {}: {}; training.on_nonfinite = \"stop\" ends the run before that optimizer step (no "
        "checkpoint of it is written; \"skip_step\" would skip such steps, a lower optim.lr or "
        "training.grad_clip_norm may avoid them)",
        where(), found()));
  }
  if (verdict == StepVerdict::SkipNonfinite) count_nonfinite_skip();
  if (verdict != StepVerdict::Step) return {true, 0.0, {}};
  take_step();
  if (skipped_.in_a_row() > 0) {
    skipped_.stepped();
    metrics_.set_skipped(skipped_.total(), 0);
  }
  return {false, totals.loss, totals.stats};
}

std::string TrainStep::where() const {
  return fmt::format("step {} (epoch {}, batch {})", state_.global_step + 1, state_.epoch + 1,
                     state_.batch_in_epoch + 1);
}

std::string TrainStep::found() const {
  // A rank whose plugin skipped before the check found nothing itself: the ranks agreed on another's.
  return nonfinite_.empty() ? "another rank found a NaN or infinite loss or gradient" : nonfinite_;
}

void TrainStep::count_nonfinite_skip() {
  skipped_.skipped();
  metrics_.set_skipped(skipped_.total(), skipped_.in_a_row());
  if (skipped_.diverged()) {
    drop_gradients(*parts_.model);
    // The window so far, and the counts, are in metrics.jsonl before the run ends.
    metrics_.log(state_);
    metrics_.commit();
    throw Diverged(fmt::format(
        "training diverged: {} optimizer steps in a row skipped for a NaN or infinite loss or gradient "
        "(training.on_nonfinite = \"skip_step\"; training.max_skipped_steps = {}; {} skipped in the run), the last "
        "at {}: {}; no checkpoint of it is written (a lower optim.lr or training.grad_clip_norm may avoid this)",
        skipped_.in_a_row(), training_.max_skipped_steps, skipped_.total(), where(), found()));
  }
  if (skipped_.warn_each()) {
    log_.warn("{}: {}; optimizer step skipped (training.on_nonfinite = \"skip_step\"; {} skipped so far, {} in a row)",
              where(), found(), skipped_.total(), skipped_.in_a_row());
  }
}

void TrainStep::end_epoch() {
  const std::int64_t n = skipped_.take_epoch();
  if (n == 0) return;
  log_.warn(
      "epoch {}: {} optimizer step{} skipped for a NaN or infinite loss or gradient (training.on_nonfinite = "
      "\"skip_step\"; {} in the run, {} in a row now)",
      state_.epoch + 1, n, n == 1 ? "" : "s", skipped_.total(), skipped_.in_a_row());
}

StepVerdict TrainStep::before_optimizer_step(bool skip) {
  if (!skip) skip = hooks_.fire(Event::GradientsAccumulated).skip_step;
  if (skip) return StepVerdict::Skip;
  if (training_.grad_clip_norm > 0) {
    state_.grad_norm = torch::nn::utils::clip_grad_norm_(parts_.model->parameters(), training_.grad_clip_norm);
  }
  if (const StepVerdict v = nonfinite(); v != StepVerdict::Step) return v;
  set_learning_rate(*parts_.optim, state_.lr);
  if (hooks_.fire(Event::BeforeOptimizerStep).skip_step) return StepVerdict::Skip;
  prepare_step();
  return StepVerdict::Step;
}

StepVerdict TrainStep::nonfinite() {
  if (training_.on_nonfinite == "ignore") return StepVerdict::Step;
  // NaN, infinity, -infinity (not C's "-nan", whose sign means nothing).
  const auto text = [](double v) { return std::isnan(v) ? std::string("NaN") : v > 0 ? "infinity" : "-infinity"; };
  std::string what;
  if (!std::isfinite(state_.loss)) {
    what = "the loss is " + text(state_.loss);
  } else {
    // The gradients' norm: clipping's when it clips; else computed here (fused per group of
    // tensors on a GPU, one read of the device).
    double norm = state_.grad_norm;
    if (training_.grad_clip_norm <= 0) {
      std::vector<at::Tensor> grads;
      for (const auto& p : parts_.model->parameters()) {
        if (p.grad().defined()) grads.push_back(p.grad().detach());
      }
      std::vector<at::Tensor> norms = grads.empty() ? grads : at::_foreach_norm(grads);
      for (auto& n : norms) n = n.to(at::kFloat);  // one dtype to stack (a model may mix them)
      norm = norms.empty() ? 0.0 : at::stack(norms).norm().item<double>();
    }
    if (!std::isfinite(norm)) what = "the gradient norm is " + text(norm);
  }
  if (what.empty()) return StepVerdict::Step;
  nonfinite_ = what;
  return training_.on_nonfinite == "stop" ? StepVerdict::Diverge : StepVerdict::SkipNonfinite;
}

StepTotals TrainStep::forward_backward(const at::Tensor& indices, std::int64_t micro, std::int64_t global_size) {
  const std::int64_t n = indices.size(0);
  oom_.enter(OomPhase::Data);
  // On the host, read ahead by the loader's workers; micro-batches move one at a time. (A rank
  // whose part of a short last batch is empty reads nothing and adds nothing.)
  const Batch full = n == 0          ? Batch{}
                     : parts_.loader ? parts_.loader->next(indices)
                                     : parts_.train_set->get_in_epoch(indices, state_.epoch);
  drop_gradients(*parts_.model);
  return accumulate(full, indices, micro, global_size);
}

StepTotals TrainStep::accumulate(const Batch& full, const at::Tensor& indices, std::int64_t micro,
                                 std::int64_t global_size) {
  const std::int64_t n = full.inputs.defined() ? full.size() : 0;
  state_.num_micro_batches = n / micro + (n % micro != 0);
  // Each micro-batch's mean loss counts by its share of the batch: of the global batch's samples,
  // or of the weight of the batch when the task weighs samples (Task::sample_weights).
  const at::Tensor weights = n > 0 ? parts_.task->sample_weights(full.targets) : at::Tensor();
  std::vector<double> mb_weight;  // per micro-batch
  double denominator = static_cast<double>(global_size), local_weight = 0.0;
  if (weights.defined()) {
    TRAINER_CHECK(weights.dim() == 1 && weights.size(0) == n, "task '", parts_.task_name, "': sample_weights gave ",
                  weights.sizes(), " for ", n, " samples");
    const at::Tensor w = weights.to(at::kCPU, at::kDouble).contiguous();
    const double* wv = w.data_ptr<double>();
    for (std::int64_t i = 0; i < state_.num_micro_batches; ++i) {
      double sum = 0.0;
      for (std::int64_t k = i * micro, end = std::min(n, k + micro); k < end; ++k) {
        TRAINER_CHECK(wv[k] >= 0 && std::isfinite(wv[k]), "task '", parts_.task_name, "': sample weight ", wv[k],
                      "; weights are finite and at least 0");
        sum += wv[k];
      }
      mb_weight.push_back(sum);
      local_weight += sum;
    }
    denominator = sync_->weight_denominator(local_weight, global_size);
  }
  bool skip = false;
  at::Tensor loss_sum, stats_sum;  // summed on the device, read once at the end
  for (std::int64_t i = 0; i < state_.num_micro_batches; ++i) {
    const std::int64_t begin = i * micro, len = std::min(micro, n - begin);
    const bool whole = state_.num_micro_batches == 1;
    const at::Tensor idx = whole ? indices : indices.narrow(0, begin, len);
    state_.micro_batch_index = i;
    // Only the micro-batch being computed is on the device: its memory shrinks with it.
    oom_.enter(OomPhase::Forward);
    const Batch mb = [&] {
      // The micro-batch's copy on the device (a GPU's) is the batch's, not an activation.
      const detail::MemoryTagScope batch(MemoryCategory::Batch, static_cast<std::uint8_t>(int(OomPhase::Forward) + 1));
      return to_device(parts_,
                       whole ? full : Batch{full.inputs.narrow(0, begin, len), full.targets.narrow(0, begin, len)});
    }();
    skip |= hooks_.fire(Event::BeforeForward, EventArgs::micro_batch(mb, idx)).skip_step;
    at::Tensor out, loss;
    {
      // Plugins' scopes (autocast) cover the forward and the loss, and close on every exit path.
      const auto scopes = hooks_.forward_scopes(Event::BeforeForward, EventArgs::micro_batch(mb, idx));
      out = parts_.model->forward(mb.inputs);
      check_outputs(out, *parts_.task);
      loss = parts_.task->mean_loss(out, mb.targets);
      const double share = weights.defined() ? mb_weight[static_cast<std::size_t>(i)] : static_cast<double>(len);
      if (share != denominator) loss = loss * (share / denominator);
    }
    skip |= hooks_.fire(Event::AfterForward, EventArgs::micro_batch(mb, idx, &out, &loss)).skip_step;
    at::Tensor backward_loss = loss;  // plugins may replace it in BeforeBackward (loss scaling)
    EventArgs before_backward = EventArgs::micro_batch(mb, idx, nullptr, &loss);
    before_backward.backward_loss = &backward_loss;
    skip |= hooks_.fire(Event::BeforeBackward, before_backward).skip_step;
    TRAINER_CHECK(backward_loss.defined() && backward_loss.numel() == 1, "a plugin left ctx.backward_loss ",
                  backward_loss.defined() ? "with " + std::to_string(backward_loss.numel()) + " elements"
                                          : std::string("undefined"),
                  " in BeforeBackward; it must stay a one-element tensor");
    oom_.enter(OomPhase::Backward);
    // The last micro-batch's backward completes the gradients: a data-parallel run may start
    // their all-reduce inside it.
    if (i + 1 == state_.num_micro_batches) sync_->before_last_backward();
    backward_loss.backward();
    skip |= hooks_.fire(Event::AfterBackward, EventArgs::micro_batch(mb, idx, nullptr, &loss)).skip_step;
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
    const at::Tensor stats = parts_.task->train_sums(out.detach(), mb.targets);
    TRAINER_CHECK(stats.numel() == parts_.task->train_width(), "task '", parts_.task_name, "': train_sums gave ",
                  stats.numel(), " values; its train_width() is ", parts_.task->train_width());
    stats_sum = stats_sum.defined() ? stats_sum + stats : stats;
  }
  const auto width = static_cast<std::size_t>(parts_.task->train_width());
  if (!loss_sum.defined()) return {0.0, std::vector<double>(width, 0.0), skip};  // no samples on this rank
  // One read of the device for all (one synchronisation on a GPU).
  const at::Tensor all = at::cat({loss_sum.to(at::kDouble).reshape({1}), stats_sum.to(at::kDouble)}).cpu();
  const double* v = all.data_ptr<double>();
  return {v[0], std::vector<double>(v + 1, v + 1 + width), skip, weights.defined(), local_weight};
}

void TrainStep::prepare_step() {
  oom_.enter(OomPhase::OptimizerStep);
  if (reserve_for_ != oom_.rungs().optimizer_changes()) {
    // The step's temporaries: its parameter-sized temporaries times the largest parameter, plus
    // 64 KiB for scalars. Again for an optimizer whose moments changed bits (a new object).
    std::int64_t largest = 0, most_values = 0;
    for (const auto& p : parts_.model->parameters()) {
      largest = std::max<std::int64_t>(largest, p.nbytes());
      most_values = std::max<std::int64_t>(most_values, p.numel());
    }
    // The compact AdamW steps a chunk at a time: its temporaries are a chunk's, in bytes.
    reserve_ = dynamic_cast<const detail::AdamW8bit*>(parts_.optim.get()) != nullptr
                   ? detail::AdamW8bit::step_temporary_bytes(most_values) + (64 << 10)
                   : optimizer_step_temporaries(*parts_.optim) * largest + (64 << 10);
    reserve_for_ = oom_.rungs().optimizer_changes();
    state_materialized_ = false;
  }
  if (!state_materialized_) {
    state_materialized_ = materialize_optimizer_state(*parts_.optim);
    attribute_run_memory(nullptr, parts_.optim.get());  // the state it created
  }
  { at::Tensor reserve = at::empty({reserve_}, at::TensorOptions(at::kByte).device(parts_.device)); }
}

void TrainStep::take_step() {
  try {
    parts_.optim->step();
  } catch (const std::exception& e) {
    // Whatever failed inside the step (the reserve was not enough, an optimizer's own error,
    // std::bad_alloc, a device error), some parameters may already be updated: neither a
    // retry nor a checkpoint of them is safe.
    params_consistent_ = false;
    if (!is_out_of_memory(e)) throw;
    throw OomFailure(fmt::format("out of memory inside the optimizer step after its reserve ({}); parameters may be "
                                 "partly updated, so the run stops without a final checkpoint: {}",
                                 format_bytes(reserve_), detail::error_text(e)),
                     OomPhase::OptimizerStep);
  } catch (...) {
    params_consistent_ = false;
    throw;
  }
}

void TrainStep::apply_micro_batch_request(const Control& c) {
  if (!c.micro_batch_size) return;
  const std::int64_t next = std::clamp<std::int64_t>(*c.micro_batch_size, 1, training_.batch_size);
  if (next == micro_batch_) return;
  log_.info("micro-batch {} -> {}{}", micro_batch_, next, c.reason.empty() ? "" : " (" + c.reason + ")");
  micro_batch_ = next;
}

}  // namespace trainer
