#include "train/loop.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "data/epoch_order.h"
#include "dist/shard.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/hooks.h"
#include "train/runtime_threads.h"
#include "train/setup.h"
#include "train/train_metrics.h"
#include "trainer/interrupt.h"
#include "trainer/loader.h"

namespace trainer {

void EpochLoop::start_at(Position p) {
  start_ = p;
  epochs_completed_ = p.epoch;
  step_.set_position(p);
  state_.epoch = p.epoch;
  state_.batch_in_epoch = batch_index(parts_.train_set->size(), p.sample);
}

std::optional<StopCause> EpochLoop::run() {
  const std::int64_t first_step = state_.global_step;
  auto why = train_epochs();
  if (why) {
    // Stopped between log_every steps (training.max_steps, a plugin, a signal): the steps since
    // the last log are logged, so a run always ends with its final training metrics.
    window_.log(state_);
    window_.commit();
  }
  // Not after a signal or a plugin's stop (they stop now); not when this process trained
  // nothing (a resumed run that was already done).
  const bool ended =
      (!why && !interrupt_requested() && !hooks_.stop_requested()) || (why && why->kind == StopKind::MaxSteps);
  bool at_end = s_.eval.at_end && ended && state_.global_step > first_step && evaluated_at_ != state_.global_step;
  // An evaluation is collective in a data-parallel run: every rank or none.
  if (s_.eval.at_end && parts_.group) at_end = parts_.group->all_reduce_max(at_end ? 0 : 1) == 0;
  if (at_end) evaluate();
  return why;
}

void EpochLoop::evaluate() {
  evaluator_.run();
  checkpointer_.check_monitor();
  evaluated_at_ = state_.global_step;
}

std::optional<StopCause> EpochLoop::train_epochs() {
  window_.start();
  // A resumed run may already be done (max_steps reached, e.g. by an automatic requeue).
  if (auto why = stop_reason()) return why;
  std::int64_t first_sample = start_.sample;
  for (std::int64_t epoch = start_.epoch; epoch < s_.training.epochs; ++epoch) {
    const at::Tensor order = epoch_order(epoch);
    const std::int64_t n = order.size(0);
    state_.epoch = epoch;
    state_.batch_in_epoch = batch_index(n, first_sample);
    // runtime.num_threads = 0: the load of the epoch before may leave more or fewer cores free.
    if (epoch > start_.epoch && parts_.threads) parts_.threads->at_epoch();
    if (parts_.loader) {
      std::vector<at::Tensor> batches;
      for (std::int64_t begin = first_sample; batches_left(n, begin) > 0;) {
        const std::int64_t end = begin + std::min(s_.training.batch_size, n - begin);
        batches.push_back(local(order.slice(0, begin, end)));
        begin = end;
      }
      parts_.loader->plan(epoch, std::move(batches));
    }
    hooks_.fire(Event::EpochStart);
    for (std::int64_t begin = first_sample; batches_left(n, begin) > 0;) {
      const std::int64_t end = begin + std::min(s_.training.batch_size, n - begin);
      const bool last = batches_left(n, end) == 0;
      state_.batch_in_epoch = batch_index(n, begin);
      const bool stepped = step_.run(local(order.slice(0, begin, end)), end - begin,
                                     last ? Position{epoch + 1, 0} : Position{epoch, end});
      step_.apply_micro_batch_request(hooks_.fire(Event::BatchEnd));
      after_batch(stepped, last);
      if (!last) window_.commit();  // the epoch's last step is committed after its end (eval, EpochEnd)
      // A stop on the last batch of an epoch still finishes the epoch (eval, EpochEnd).
      if (!last) {
        if (auto why = stop_reason()) return why;
      }
      begin = end;
    }
    first_sample = 0;
    end_epoch(epoch);
    window_.commit();
    // After the last epoch the run is complete: a stop asked for now stops nothing.
    if (epoch + 1 < s_.training.epochs) {
      if (auto why = stop_reason()) return why;
    }
  }
  return std::nullopt;
}

std::int64_t EpochLoop::batches_left(std::int64_t n, std::int64_t begin) const {
  const std::int64_t left = std::max<std::int64_t>(0, n - begin), bs = s_.training.batch_size;
  return left / bs + (!s_.training.drop_last && left % bs != 0 ? 1 : 0);
}

std::int64_t EpochLoop::batch_index(std::int64_t n, std::int64_t begin) const {
  return std::max<std::int64_t>(0, state_.steps_per_epoch - batches_left(n, begin));
}

void EpochLoop::after_batch(bool stepped, bool last) {
  if (stepped && state_.global_step % s_.training.log_every == 0) window_.log(state_);
  bool eval = hooks_.take_eval_request();
  // An evaluation and a checkpoint are collective in a data-parallel run: asked on any rank,
  // they happen on all (a checkpoint asked in the epoch's last batch waits for its end).
  bool checkpoint = !last && hooks_.take_checkpoint_request();
  if (parts_.group) {
    const auto asked = parts_.group->all_reduce_max({eval ? 1 : 0, checkpoint ? 1 : 0});
    eval = asked[0] > 0;
    checkpoint = asked[1] > 0;
  }
  // eval.every_steps, unless the epoch's end evaluates at this step anyway.
  const std::int64_t every_eval = s_.eval.every_steps;
  eval |= stepped && every_eval > 0 && state_.global_step % every_eval == 0 && !(last && epoch_evaluates(state_.epoch));
  if (eval) evaluate();
  const std::int64_t every = s_.checkpoint.every_steps;
  const bool due = stepped && every > 0 && state_.global_step % every == 0;
  if (last) {
    // The epoch's end (its evaluation, EpochEnd) writes it, once, with what plugins know then.
    checkpoint_due_ = due;
    return;
  }
  if (checkpoint || due) checkpointer_.save(step_.position());
}

void EpochLoop::end_epoch(std::int64_t epoch) {
  window_.log(state_);
  step_.end_epoch();
  if (epoch_evaluates(epoch)) evaluate();
  epochs_completed_ = epoch + 1;
  hooks_.fire(Event::EpochEnd);
  // Requested during the epoch's last batch, its evaluation or EpochEnd, due by every_steps at
  // its last step, or due every_epochs.
  bool requested = hooks_.take_checkpoint_request();
  if (parts_.group) requested = parts_.group->all_reduce_max(requested ? 1 : 0) > 0;  // asked on any rank
  requested = std::exchange(checkpoint_due_, false) || requested;
  const std::int64_t every = s_.checkpoint.every_epochs;
  if (requested || (every > 0 && (epoch + 1) % every == 0)) checkpointer_.save({epoch + 1, 0});
}

bool EpochLoop::epoch_evaluates(std::int64_t epoch) const {
  return s_.eval.every_epochs > 0 && (epoch + 1) % s_.eval.every_epochs == 0;
}

std::optional<StopCause> EpochLoop::stop_reason() const {
  auto why = local_stop_reason();
  if (!parts_.group) return why;
  // The ranks stop together, at the same batch: one that went on alone would wait in the next
  // collective for those that stopped. A stop on any rank is every rank's, and the strongest
  // cause wins: a signal (the run is KILLED on every rank), a plugin's stop, training.max_steps.
  const auto code = [](const std::optional<StopCause>& c) -> std::int64_t {
    return c ? static_cast<std::int64_t>(c->kind) : 0;
  };
  constexpr std::int64_t kRanks = 1 << 20;
  const std::int64_t agreed = parts_.group->all_reduce_max(code(why) * kRanks + parts_.group->rank());
  const std::int64_t cause = agreed / kRanks, rank = agreed % kRanks;
  if (cause <= code(why)) return why;
  const std::string where = " on rank " + std::to_string(rank);
  switch (static_cast<StopKind>(cause)) {
    case StopKind::Signal:
      return StopCause{StopKind::Signal, "signal", "interrupted by a signal" + where};
    case StopKind::Plugin:
      return StopCause{StopKind::Plugin, "rank " + std::to_string(rank), "a plugin stopped the run" + where};
    case StopKind::MaxSteps:
      break;
  }
  return StopCause{StopKind::MaxSteps, "training.max_steps", "training.max_steps reached" + where};
}

std::optional<StopCause> EpochLoop::local_stop_reason() const {
  if (interrupt_requested()) return StopCause{StopKind::Signal, "signal", "interrupted by a signal"};
  if (hooks_.stop_requested()) return StopCause{StopKind::Plugin, hooks_.stopped_by(), hooks_.stop_reason()};
  if (s_.training.max_steps > 0 && state_.global_step >= s_.training.max_steps) {
    return StopCause{StopKind::MaxSteps, "training.max_steps",
                     "training.max_steps = " + std::to_string(s_.training.max_steps) + " reached"};
  }
  return std::nullopt;
}

at::Tensor EpochLoop::local(const at::Tensor& batch) const {
  if (!parts_.group) return batch;
  const auto [begin, end] = shard_range(batch.size(0), parts_.group->rank(), parts_.group->size());
  return batch.slice(0, begin, end);
}

at::Tensor EpochLoop::epoch_order(std::int64_t epoch) const {
  return detail::epoch_order(parts_.train_set->size(), s_.training.shuffle, s_.seed, epoch,
                             s_.training.group_by_length ? parts_.train_set->lengths() : at::Tensor(),
                             s_.training.batch_size);
}

}  // namespace trainer
