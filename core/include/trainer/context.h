#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "trainer/config.h"
#include "trainer/data.h"
#include "trainer/events.h"
#include "trainer/memory.h"
#include "trainer/metrics.h"
#include "trainer/model.h"
#include "trainer/plugin_state.h"
#include "trainer/states.h"

namespace spdlog {
class logger;
}
namespace torch::optim {
class Optimizer;
}

namespace trainer {

class ProcessGroup;

/// Counters of the run, updated by the core before each event.
struct RunState {
  std::int64_t epoch = 0;  ///< 0-based current epoch
  std::int64_t num_epochs = 0;
  std::int64_t global_step = 0;     ///< optimizer steps completed
  std::int64_t total_steps = 0;     ///< optimizer steps planned for the whole run
  std::int64_t batch_in_epoch = 0;  ///< 0-based index of the current batch in its epoch
  std::int64_t steps_per_epoch = 0;
  std::int64_t batch_size = 0;         ///< effective batch (samples per optimizer step)
  std::int64_t micro_batch_size = 0;   ///< samples per forward/backward
  std::int64_t micro_batch_index = 0;  ///< 0-based index within the current batch
  std::int64_t num_micro_batches = 0;  ///< micro-batches of the current batch
  std::int64_t samples_seen = 0;       ///< training samples processed this run
  double loss = 0.0;                   ///< last batch's mean training loss (BatchEnd)
  double lr = 0.0;                     ///< learning rate of the current step
  /// Total L2 norm of the batch's gradient before clipping (BeforeOptimizerStep on); computed
  /// only when training.grad_clip_norm > 0, else 0.
  double grad_norm = 0.0;
  std::int64_t oom_recoveries = 0;  ///< out-of-memory errors handled (OutOfMemory fired) this run
  /// The memory savers switched on by Control (oom_backoff's ladder; docs/memory.md): the
  /// blocks the core checkpoints (Control::checkpointed_blocks) of the model's `model_blocks`,
  /// the bits of AdamW's moments (32, 16 or 8; 0 when the optimizer's cannot change), and
  /// whether they are offloaded to host memory (Control::optimizer_offload).
  std::int64_t checkpointed_blocks = 0;
  std::int64_t model_blocks = 0;
  int optimizer_moment_bits = 0;
  bool optimizer_offload = false;
  /// The bits optim.name gives (32 for "adamw", 8 for "adamw8bit", 0 for others).
  int configured_moment_bits = 0;
};

/// What failed, for the OutOfMemory event.
struct OomInfo {
  OomPhase phase = OomPhase::Forward;  ///< where it failed; oom_phase_name(phase) is "optimizer_step" …
  std::string message;                 ///< the error's message
  std::int64_t requested_bytes = 0;    ///< the refused allocation (0 when unknown)
  std::int64_t micro_batch_size = 0;   ///< micro-batch (eval: eval batch) of the failed attempt
  std::int64_t batch_size = 0;         ///< samples of the batch being retried (eval: the test set)
  std::int64_t attempt = 0;            ///< 0 for the first failure of this batch, then 1, 2, ...
  /// Whether a smaller micro-batch (eval batch) can need less memory here: false in Data
  /// (the batch is read whole on the host before it is split), AllReduce (a data-parallel
  /// rank's flat copy of every gradient), OptimizerStep (parameters, gradients, optimizer
  /// state and the step's temporaries) and Checkpoint.
  bool micro_batch_helps = true;
  MemoryStats stats;  ///< device counters right after the failed attempt was dropped
  /// The live memory by category at the moment the allocation was refused, before the failed
  /// attempt was dropped (the refused request not among it): on the CPU with memory categories
  /// on, when the error came from the allocator; nullopt otherwise.
  std::optional<MemoryBreakdown> live;
};

/// What a hook may read and act on. The core owns everything referenced here; pointers are
/// null where the event comes before the object exists (docs/events.md lists, per event,
/// what is set). Plugins may replace `model` in ModelCreated and choose `device` in
/// SelectDevice; everything else they read, or change through Control.
struct TRAINER_API EventContext {
  Event event = Event::Init;
  const Config* config = nullptr;          ///< resolved config (always set)
  std::shared_ptr<spdlog::logger> logger;  ///< the run's logger (always set)
  MetricsLogger* metrics = nullptr;        ///< log metrics here (always set)
  std::string run_dir;                     ///< the run directory (always set)
  RunState state;
  c10::Device device = c10::Device(c10::kCPU);  ///< the run's device (SelectDevice proposes runtime.device)
  std::shared_ptr<Model> model;                 ///< from ModelCreated on
  /// The training and test datasets, from ModelCreated on (test_set null when the run never
  /// evaluates). Replaceable in ModelCreated, with the model: a linear probe that caches its
  /// backbone's features trains a head on a dataset of features.
  std::shared_ptr<Dataset> train_set, test_set;
  /// From OptimizerCreated on. Read it at each event, do not keep it: a change of AdamW's moments'
  /// bits or place (Control::optimizer_moment_bits, optimizer_offload) replaces the optimizer, in
  /// BatchStart and OutOfMemory.
  torch::optim::Optimizer* optimizer = nullptr;
  const Batch* batch = nullptr;         ///< current micro-batch (Before/AfterForward/Backward)
  const at::Tensor* indices = nullptr;  ///< dataset indices of `batch` (int64; same events as `batch`)
  const at::Tensor* outputs = nullptr;  ///< logits (AfterForward)
  const at::Tensor* loss = nullptr;     ///< scaled micro-batch loss (AfterForward, Before/AfterBackward);
                                        ///< EvalBatchEnd: the eval batch's mean loss
  /// BeforeBackward: the tensor backward() runs on, *loss to begin with. A plugin may replace
  /// it (a GradScaler multiplies it by the loss scale; an auxiliary term may be added); the
  /// training loss logged stays *loss.
  at::Tensor* backward_loss = nullptr;
  /// EvalMetrics: the evaluation's metrics, writable: add your own ("eval/f1"), logged with
  /// the core's right after. EvalEnd: all of them, already logged (changes are not logged).
  std::map<std::string, double>* eval_metrics = nullptr;
  const OomInfo* oom = nullptr;        ///< OutOfMemory
  const ResumeInfo* resume = nullptr;  ///< Resume: what was restored
  std::string checkpoint_path;         ///< Checkpoint: the file just written; Resume: the file loaded
  std::exception_ptr exception;        ///< Exception: what failed
  /// Running until FitEnd (Finished or Killed) or Exception (Failed, or Killed when interrupted
  /// while waiting for a device); Shutdown: any. run_status_name(status) is "FINISHED" ….
  RunStatus status = RunStatus::Running;
  /// The ranks of a data-parallel run (trainer/distributed.h), null in a run of one. Each rank
  /// evaluates its part of the test split, and EvalMetrics fires on every rank at the same
  /// point: a plugin sums its partial counts there (group->all_reduce_sum) so its metric covers
  /// every sample. Any collective a plugin makes must be made on every rank, in the same order.
  ProcessGroup* group = nullptr;
};

}  // namespace trainer
