#include "train/step.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>

#include "dist/grad_sync.h"
#include "train/hooks.h"
#include "train/oom_recovery.h"
#include "train/setup.h"
#include "train/train_metrics.h"
#include "trainer/distributed.h"
#include "trainer/loader.h"
#include "trainer/optim.h"
#include "util/error_text.h"

namespace trainer {

namespace {

/// Adds the time of a data-parallel step's collectives to the window's dist/comm_s.
class CommTimer {
 public:
  explicit CommTimer(TrainMetrics& m) : m_(m) {}
  ~CommTimer() { m_.add_comm(std::chrono::duration<double>(TrainMetrics::Clock::now() - t0_).count()); }
  CommTimer(const CommTimer&) = delete;
  CommTimer& operator=(const CommTimer&) = delete;

 private:
  TrainMetrics& m_;
  TrainMetrics::Clock::time_point t0_ = TrainMetrics::Clock::now();
};

}  // namespace

TrainStep::TrainStep(const TrainingSettings& training, RunParts& parts, RunState& state, Hooks& hooks, OomRecovery& oom,
                     TrainMetrics& metrics, spdlog::logger& log)
    : training_(training),
      parts_(parts),
      state_(state),
      hooks_(hooks),
      oom_(oom),
      metrics_(metrics),
      log_(log),
      micro_batch_(training.micro_batch()) {
  // The step's temporaries: its parameter-sized temporaries times the largest parameter, plus
  // 64 KiB for scalars.
  std::int64_t largest = 0;
  for (const auto& p : parts_.model->parameters()) largest = std::max<std::int64_t>(largest, p.nbytes());
  reserve_ = optimizer_step_temporaries(*parts_.optim) * largest + (64 << 10);
  if (parts_.group) {
    // A plugin handling AfterBackward may change the gradients there (mixed_precision unscales
    // them), after an overlapped all-reduce would have sent them: then it waits for the
    // backward's end. The ranks agree, so that they all start the same collectives.
    bool overlap = parts_.overlap;
    if (overlap && hooks_.wants(Event::AfterBackward)) {
      log_.info(
          "gradients: the all-reduce starts after the backward, not inside it: a plugin handles AfterBackward, "
          "where it may change them");
      overlap = false;
    }
    overlap = parts_.group->all_reduce_max(overlap ? 0 : 1) == 0;
    sync_ = std::make_unique<GradientSync>(*parts_.group, parts_.model->parameters(), parts_.bucket_bytes, overlap);
    log_.info("gradients: {} bucket{} of up to {:g} MiB{}", sync_->num_buckets(), sync_->num_buckets() == 1 ? "" : "s",
              static_cast<double>(parts_.bucket_bytes) / (1 << 20),
              overlap ? ", each all-reduced inside the backward once its gradients are complete (from the second step)"
                      : ", all-reduced after the backward");
  }
}

TrainStep::~TrainStep() = default;

bool TrainStep::run(const at::Tensor& indices, std::int64_t global_size, Position next) {
  const std::int64_t n = indices.size(0);
  next_ = next;
  // BatchStart reports the micro-batch setting; attempts report the size they really use
  // (capped at the batch, which is shorter at the end of an epoch).
  state_.micro_batch_size = micro_batch_;
  state_.num_micro_batches = n / micro_batch_ + (n % micro_batch_ != 0);  // no n + micro - 1 to overflow
  state_.micro_batch_index = 0;
  const Control start = hooks_.fire(Event::BatchStart);
  resize(start);
  bool skip_batch = start.skip_step;
  if (parts_.group) {
    // A data-parallel run skips a batch on every rank or on none (the others would wait in its
    // all-reduce), and every rank uses the smallest micro-batch any rank asks for (oom_backoff
    // growing back hears the same events on every rank, so they normally ask the same).
    const auto agreed = [&] {
      CommTimer timer(metrics_);
      return parts_.group->all_reduce_max({skip_batch ? 1 : 0, -micro_batch_});
    }();
    skip_batch = agreed[0] > 0;
    if (-agreed[1] != micro_batch_) {
      log_.info("micro-batch {} -> {} (agreed by the ranks)", micro_batch_, -agreed[1]);
      micro_batch_ = -agreed[1];
    }
    state_.micro_batch_size = micro_batch_;
  }
  if (skip_batch) {
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
  bool skipped = false;
  double batch_loss = 0.0;
  std::int64_t batch_correct = 0;
  // The samples an attempt covers: in a data-parallel run the largest part any rank holds, so
  // that every rank reports the same sizes to its plugins (parts differ by one at most).
  const std::int64_t part = parts_.group ? (global_size + parts_.group->size() - 1) / parts_.group->size() : n;
  const auto settled = oom_.retry(
      OomRetry::AskPlugins, std::max<std::int64_t>(1, std::min(micro_batch_, part)), std::max<std::int64_t>(1, part),
      [&](std::int64_t micro) {
        state_.micro_batch_size = micro;
        auto [loss, correct, skip] = parts_.group ? agreed_forward_backward(indices, micro, global_size)
                                                  : forward_backward(indices, micro, global_size);
        state_.loss = loss;
        state_.lr = parts_.schedule->lr_at(state_.global_step);
        state_.grad_norm = 0.0;
        // From here on the memory needed does not depend on the micro-batch.
        std::optional<LocalOom> failed;
        try {
          oom_.enter(OomPhase::OptimizerStep);
          if (sync_) sync_->unpack();
          if (!skip) skip = hooks_.fire(Event::GradientsAccumulated).skip_step;
          if (!skip) {
            if (training_.grad_clip_norm > 0) {
              state_.grad_norm =
                  torch::nn::utils::clip_grad_norm_(parts_.model->parameters(), training_.grad_clip_norm);
            }
            set_learning_rate(*parts_.optim, state_.lr);
            skip = hooks_.fire(Event::BeforeOptimizerStep).skip_step;
          }
          if (!skip) prepare_step();
        } catch (const std::exception& e) {
          if (!parts_.group || !is_out_of_memory(e)) throw;
          failed = LocalOom{oom_.phase(), detail::error_text(e)};
        }
        if (parts_.group) {
          CommTimer timer(metrics_);
          skip = agree_before_step(failed, skip);
        }
        skipped = skip;
        if (skip) return;
        take_step();
        batch_loss = loss;
        batch_correct = correct;
      },
      parts_.group.get());
  if (settled) micro_batch_ = *settled;  // later batches keep the size that worked (oom_backoff grows it back)
  if (skipped) {
    drop_gradients(*parts_.model);
    log_.debug("optimizer step skipped at batch {}", state_.batch_in_epoch);
    advance();
    return false;
  }
  ++state_.global_step;
  state_.samples_seen += global_size;
  advance();
  hooks_.fire(Event::AfterOptimizerStep);
  metrics_.add_step(batch_loss, global_size, batch_correct, state_.micro_batch_size,
                    training_.grad_clip_norm > 0 ? std::optional<double>(state_.grad_norm) : std::nullopt);
  return true;
}

TrainStep::Accumulated TrainStep::forward_backward(const at::Tensor& indices, std::int64_t micro,
                                                   std::int64_t global_size) {
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

TrainStep::Accumulated TrainStep::agreed_forward_backward(const at::Tensor& indices, std::int64_t micro,
                                                          std::int64_t global_size) {
  // The local half: this rank's forward and backward, its gradients into the buckets. An
  // out-of-memory error here is held until every rank has said how its half went: then all
  // drop the attempt together, and none is left waiting in an all-reduce.
  Accumulated local;
  std::optional<LocalOom> failed;
  try {
    local = forward_backward(indices, micro, global_size);
    oom_.enter(OomPhase::AllReduce);
    sync_->pack();
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    failed = LocalOom{oom_.phase(), detail::error_text(e)};
    drop_gradients(*parts_.model);
    // The buckets the other ranks start inside their backward, this rank starts too (as they
    // are: the attempt is dropped everywhere), so that none waits in a collective.
    if (sync_->overlapping()) {
      log_.info("all-reduce: {} of {} buckets started inside the backward before it failed; the other {} start as "
                "they are, and every rank drops the attempt",
                sync_->started_in_backward(), sync_->num_buckets(),
                sync_->num_buckets() - sync_->started_in_backward());
    }
    sync_->abandon();
  }
  CommTimer timer(metrics_);
  const auto agreed = sync_->agree(local.loss, local.correct, local.skip, failed ? oom_phase_info(failed->phase).wire_code : 0);
  if (agreed.failed_rank >= 0) {
    sync_->wait_started();
    throw_ranks_out_of_memory(failed, agreed.failed_rank, oom_phase_of_wire(agreed.failed_phase));
  }
  if (sync_->overlapping() && !overlap_reported_) {
    overlap_reported_ = true;
    log_.info("all-reduce: {} of {} buckets started inside the backward of the first overlapped step",
              sync_->started_in_backward(), sync_->num_buckets());
  }
  // Every rank steps with the global batch's mean gradient (each loss was divided by the
  // global batch), and reports the global batch's loss.
  {
    const auto t0 = TrainMetrics::Clock::now();
    sync_->reduce(1.0);
    metrics_.add_all_reduce(std::chrono::duration<double>(TrainMetrics::Clock::now() - t0).count());
  }
  if (sync_->regraded() && !regraded_reported_) {
    regraded_reported_ = true;
    log_.warn(
        "all-reduce: a gradient was accumulated again after its bucket had started (a backward inside the "
        "backward?): every bucket is reduced again after the backward, at the cost of the overlap "
        "(distributed.overlap = false avoids the double work)");
  }
  return {agreed.loss, agreed.correct, agreed.skip};
}

bool TrainStep::agree_before_step(const std::optional<LocalOom>& failed, bool skip) {
  // After the gradients' all-reduce, before the optimizer step: a rank that ran out of memory
  // here (a plugin's unscaling, clipping, the optimizer's state or reserve) retries the batch
  // with every other rank; a skip asked on any rank is every rank's.
  const std::int64_t size = parts_.group->size(), rank = parts_.group->rank();
  // The lowest failing rank wins the max: (phase, size - 1 - rank).
  const std::int64_t code = failed ? oom_phase_info(failed->phase).wire_code * size + (size - 1 - rank) : 0;
  const auto agreed = parts_.group->all_reduce_max({code, skip ? 1 : 0});
  if (agreed[0] > 0) {
    drop_gradients(*parts_.model);
    throw_ranks_out_of_memory(failed, size - 1 - agreed[0] % size, oom_phase_of_wire(agreed[0] / size));
  }
  return agreed[1] > 0;
}

void TrainStep::throw_ranks_out_of_memory(const std::optional<LocalOom>& failed, std::int64_t rank,
                                          OomPhase phase) {
  // Every rank reports the failing rank's phase, so every rank's plugins answer alike.
  oom_.enter(phase);
  if (failed) throw RanksOutOfMemory(detail::str("on this rank (", parts_.group->rank(), "): ", failed->message));
  throw RanksOutOfMemory(
      detail::str("rank ", rank, " ran out of memory in ", oom_phase_name(phase), " (every rank drops the attempt)"));
}

TrainStep::Accumulated TrainStep::accumulate(const Batch& full, const at::Tensor& indices, std::int64_t micro,
                                             std::int64_t global_size) {
  const std::int64_t n = full.inputs.defined() ? full.size() : 0;
  state_.num_micro_batches = n / micro + (n % micro != 0);
  bool skip = false;
  at::Tensor loss_sum, correct_sum;  // summed on the device, read once at the end
  for (std::int64_t i = 0; i < state_.num_micro_batches; ++i) {
    const std::int64_t begin = i * micro, len = std::min(micro, n - begin);
    const bool whole = state_.num_micro_batches == 1;
    const at::Tensor idx = whole ? indices : indices.narrow(0, begin, len);
    state_.micro_batch_index = i;
    // Only the micro-batch being computed is on the device: its memory shrinks with it.
    oom_.enter(OomPhase::Forward);
    const Batch mb =
        to_device(parts_, whole ? full : Batch{full.inputs.narrow(0, begin, len), full.targets.narrow(0, begin, len)});
    skip |= hooks_.fire(Event::BeforeForward, EventArgs::micro_batch(mb, idx)).skip_step;
    at::Tensor out, loss;
    {
      // Plugins' scopes (autocast) cover the forward and the loss, and close on every exit path.
      const auto scopes = hooks_.forward_scopes(Event::BeforeForward, EventArgs::micro_batch(mb, idx));
      out = parts_.model->forward(mb.inputs);
      loss = at::cross_entropy_loss(out, mb.targets);
      if (len != global_size) loss = loss * (static_cast<double>(len) / static_cast<double>(global_size));
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
    if (sync_ && i + 1 == state_.num_micro_batches) sync_->arm();
    backward_loss.backward();
    skip |= hooks_.fire(Event::AfterBackward, EventArgs::micro_batch(mb, idx, nullptr, &loss)).skip_step;
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
    const at::Tensor correct = out.detach().argmax(1).eq(mb.targets).sum();
    correct_sum = correct_sum.defined() ? correct_sum + correct : correct;
  }
  if (!loss_sum.defined()) return {0.0, 0, skip};  // no samples on this rank
  // One read of the device for both (one synchronisation on a GPU).
  const at::Tensor both = at::stack({loss_sum.to(at::kDouble), correct_sum.to(at::kDouble)}).cpu();
  const double* v = both.data_ptr<double>();
  return {v[0], static_cast<std::int64_t>(v[1]), skip};
}

void TrainStep::prepare_step() {
  oom_.enter(OomPhase::OptimizerStep);
  if (!state_materialized_) state_materialized_ = materialize_optimizer_state(*parts_.optim);
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
    throw Error(detail::str(
        "out of memory inside the optimizer step after its reserve (", format_bytes(reserve_),
        "); parameters may be partly updated, so the run stops without a final checkpoint: ", detail::error_text(e)));
  } catch (...) {
    params_consistent_ = false;
    throw;
  }
}

void TrainStep::resize(const Control& c) {
  if (!c.micro_batch_size) return;
  const std::int64_t next = std::clamp<std::int64_t>(*c.micro_batch_size, 1, training_.batch_size);
  if (next == micro_batch_) return;
  log_.info("micro-batch {} -> {}{}", micro_batch_, next, c.reason.empty() ? "" : " (" + c.reason + ")");
  micro_batch_ = next;
}

}  // namespace trainer
