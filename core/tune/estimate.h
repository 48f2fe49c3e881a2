#pragma once
// `trainer estimate`: the peak memory of a training step predicted from measurement. A few
// real steps at small micro-batches (probes) give the step's peak as a function of the
// micro-batch and the batch,
//
//     forward and backward:  a + b * micro + c * (batch - micro)
//     optimizer step:        a2 + c2 * batch
//     peak = the larger of the two
//
// (a: parameters, gradients, optimizer state, data sets and whatever else is held throughout;
// b: activations, temporaries and the batch itself per sample with no accumulation (batch =
// micro); c: what each further sample of a batch split into micro-batches holds where the batch
// lives on the device: the batch and the loader's read-ahead, on the CPU; a2: the same held
// memory plus
// the optimizer step's temporaries, which do not depend on the micro-batch). A small model's
// peak is its optimizer step until the activations outgrow the step's temporaries. The probes run the recipe's
// own model, optimizer and plugins, so mixed precision and activation checkpointing are in the
// measurement. The peak is everything the device's allocator holds at the step's highest point.
//
// Over sequence lengths (--lengths: dataset.max_length, every batch padded to it), what a
// sample holds grows with its length L, attention's scores with its square:
//
//     b(L) = b + b_l1 * L + b_l2 * L^2     c(L) = c + c_l1 * L     c2(L) = c2 + c2_l1 * L
//
// and the probes run at each length asked. Without it, L is 0 and those terms are 0.
//
// When the recipe evaluates, the first probe also evaluates one batch of eval.batch_size:
//
//     evaluation:            held at its start + per sample * eval batch
//
// and the run's peak, memory_log's memory/peak_mb, is the larger of the step's and the
// evaluation's.
//
// The memory ladder: when the recipe loads oom_backoff, the rungs its ladder may take beyond
// the micro-batch are probed too (not with --lengths). Checkpointing: two probes with every
// block checkpointed (the two largest sizes) give that line's a and b; k of the N blocks are
// taken as k/N of the way from the plain line to it. For blocks alike (ViT's, a text
// encoder's) that is an upper bound: a checkpointed block keeps only its input until the
// backward pass reaches it, where it recomputes its activations after the later blocks' are
// freed, so the peak is the larger of the plain peak less k blocks' savings and a recomputing
// phase that grows with k up to the every-block peak; the straight line lies above both
// (measured on a 6-block ViT: 5 % above at 2 blocks, 15 % at 4). AdamW's
// moments in 16 and 8 bits (with allow_inexact), and in host memory (the offload rung, on a GPU
// only: on the CPU nothing moves): one probe each, at the smallest size, gives what the held
// memory, the optimizer step's and its time change by. Offloaded, the moments' bits do not
// matter to the device (none of them is there), so offload is predicted with the recipe's bits
// only. The time of a step at batch B and micro-batch m, from the probes' step times (each
// probe's fastest step after its first):
//
//     seconds = optimizer step + per micro-step * ceil(B / m) + per sample * B
//               + recomputation per sample * B * k / N  (+ the moment rung's change)
//
// and the cheapest configuration that fits is the one of least predicted time, micro-batches
// from oom_backoff's min_micro_batch to the recipe's, the exact ones (checkpointing, offload)
// first.
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "short_run.h"
#include "trainer/config_spec.h"

namespace trainer {
struct PreparedRun;
}

namespace trainer::tune {

/// What `trainer estimate` is asked.
struct EstimateRequest {
  std::string recipe;
  std::vector<std::string> overrides;
  std::vector<std::string> plugin_dirs;
  /// Micro-batches probed (each with batch = micro-batch), at least two distinct; empty:
  /// default_probe_sizes(the recipe's micro-batch).
  std::vector<std::int64_t> probe_sizes;
  std::int64_t probe_steps = 3;  ///< steps per probe (the first steps create optimizer state, fill the read-ahead)
  double margin = 0.10;          ///< the fraction of the limit kept free
  /// Where each probe's run directory is made, private (mkdtemp, mode 0700) and removed after
  /// its run (ShortRunSpec::work_dir); empty: $TMPDIR.
  std::string work_dir;
  /// Sequence lengths probed (dataset.max_length with dataset.padding = "max_length"), at
  /// least three distinct; empty: no length axis.
  std::vector<std::int64_t> lengths;
};

/// One probe as measured.
struct Probe {
  std::int64_t batch_size = 0;
  std::int64_t micro_batch = 0;
  std::int64_t peak = 0;  ///< highest allocated during a step
  std::int64_t peak_forward_backward = 0;
  std::int64_t peak_optimizer_step = 0;
  std::int64_t reserved = 0;  ///< reserved at the end of that step
  bool out_of_memory = false;
  std::string error;        ///< empty when the probe ran its steps
  std::int64_t length = 0;  ///< dataset.max_length it ran at, every batch padded to it (0: the recipe's data as is)
  std::int64_t checkpointed_blocks = 0;  ///< blocks it ran with checkpointed (the ladder's probes)
  int moment_bits = 0;                   ///< AdamW's moment bits it ran with (0: another optimizer)
  bool offload = false;                  ///< the offload rung's probe: AdamW's moments in host memory
  /// Its fastest step after the first (the first creates the optimizer state): the forward and
  /// backward passes and the optimizer step, seconds.
  double forward_backward_seconds = 0, optimizer_seconds = 0;
};

/// A configuration on oom_backoff's ladder: a micro-batch, blocks checkpointed, AdamW's moment
/// bits or its moments in host memory, and what the estimate predicts for it.
struct LadderConfig {
  std::int64_t micro_batch = 0;
  std::int64_t checkpointed_blocks = 0;
  int moment_bits = 0;    ///< 0: the optimizer as configured
  std::int64_t peak = 0;  ///< predicted peak allocated
  double time_ratio = 0;  ///< predicted step time over the recipe's own configuration's
  bool inexact = false;   ///< moment bits below the recipe's: results change
  bool offload = false;   ///< AdamW's moments (in the recipe's bits) in host memory
};

/// AdamW's moments in fewer bits than the recipe's, or (offload) in the recipe's bits in host
/// memory, as probed.
struct MomentRung {
  int bits = 0;
  double held_delta = 0;       ///< what the forward and backward's held memory changes by (bytes)
  double step_held_delta = 0;  ///< what the optimizer step's held memory changes by (bytes)
  double seconds_delta = 0;    ///< what the step's time changes by (the optimizer step's; offload: the whole step's)
  bool offload = false;        ///< the moments in host memory (bits: the recipe's)
};

/// The prediction and what it rests on.
struct MemoryEstimate {
  std::string device;
  std::int64_t batch_size = 0;   ///< the recipe's training.batch_size
  std::int64_t micro_batch = 0;  ///< the recipe's micro-batch
  // The fit, in bytes (the header's a, b, c, a2, c2; "fit" in the JSON keeps those names).
  double held = 0;                   ///< a: held throughout the forward and backward
  double per_sample = 0;             ///< b: per sample of a micro-batch
  double per_batch_sample = 0;       ///< c: per further sample of a batch split into micro-batches
  double step_held = 0;              ///< a2: held during the optimizer step
  double step_per_batch_sample = 0;  ///< c2: per sample of the batch during the optimizer step
  double slack = 0;                  ///< reserved - peak = slack + slack_per_sample * micro (allocator slack)
  double slack_per_sample = 0;
  // The length terms (0 without a length axis): b(L), c(L), c2(L) and the slack per sample as
  // in the header, the evaluation's rise per sample e + e_l1 * L + e_l2 * L^2.
  double per_sample_l1 = 0, per_sample_l2 = 0;
  double per_batch_sample_l1 = 0;
  double step_per_batch_sample_l1 = 0;
  double slack_l1 = 0;
  double eval_per_sample_l1 = 0, eval_per_sample_l2 = 0;
  /// Over lengths: the forward and backward's floor, the peak of a step too small for its
  /// activations to outgrow the gradients it creates (0: none).
  double floor = 0;
  /// The length predict() and fits_at() take: the recipe's dataset.max_length with a length
  /// axis (a batch padded to it: what a run with dynamic padding needs at most), else 0.
  std::int64_t length = 0;
  double fit_residual = 0;  ///< largest |measured - fitted| / measured over the probes
  std::vector<Probe> probes;
  std::vector<std::string> plugins;  ///< plugins active in the probes
  std::vector<std::string> notes;    ///< how the probes were run, where that matters
  /// Overrides the chosen probes ran with besides the request's (model.memory_format=... when
  /// the recipe says "auto"); --find-max-batch runs with them too.
  std::vector<std::string> probe_overrides;
  std::int64_t train_samples = 0;

  // Evaluation, measured in the first probe at the recipe's eval.batch_size.
  std::int64_t eval_batch = 0;    ///< the recipe's eval.batch_size; 0 when it does not evaluate (or unmeasured)
  std::int64_t test_samples = 0;  ///< an evaluation batch holds at most this many samples
  double eval_base = 0;           ///< allocated when the evaluation began (bytes)
  double eval_per_sample = 0;     ///< its rise per sample of the evaluation batch (bytes)
  std::int64_t eval_peak = 0;     ///< predicted peak of an evaluation at eval_batch

  // The breakdown at the recipe's (batch, micro-batch), bytes.
  std::int64_t parameters = 0;       ///< parameters and buffers
  std::int64_t gradients = 0;        ///< one per trainable parameter
  std::int64_t optimizer_state = 0;  ///< after the first steps (AdamW: two moments)
  std::int64_t resident = 0;         ///< held at the start besides the model: data sets, the process
  std::int64_t batch_memory = 0;     ///< c * (batch - micro): the batch beyond its micro-batch
  std::int64_t activations = 0;      ///< the rest of the peak: activations and temporaries
  std::int64_t peak = 0;             ///< predicted peak allocated of a training step
  std::int64_t reserved = 0;         ///< predicted reserved at the peak (allocator slack included)
  std::int64_t run_peak = 0;         ///< the larger of peak and eval_peak: memory_log's memory/peak_mb

  // Against the device or the budget.
  std::int64_t limit = 0;          ///< bytes; 0 when unknown
  std::string limit_source;        ///< "memory.limit_mb = 100", "free memory of cuda:0", ...
  bool limit_on_reserved = false;  ///< CUDA: the caching allocator's reserve is what is capped
  double margin = 0.10;
  bool fits = false;                    ///< the recipe's step and evaluation fit limit * (1 - margin)
  std::int64_t max_micro_batch = 0;     ///< largest micro-batch that fits, with batch = micro-batch
  std::int64_t max_micro_at_batch = 0;  ///< largest micro-batch <= batch_size that fits at the recipe's batch

  /// With a length axis: at each length asked, the step's peak at the recipe's (batch,
  /// micro-batch), the largest micro-batches that fit (as max_micro_batch, max_micro_at_batch;
  /// 0 when the limit is unknown) and the evaluation's peak.
  struct AtLength {
    std::int64_t length = 0, peak = 0, max_micro_batch = 0, max_micro_at_batch = 0, eval_peak = 0;
  };
  std::vector<AtLength> by_length;

  /// --find-max-batch: the largest micro-batch (batch = micro-batch) that ran its steps inside
  /// the limit, and the sizes tried; -1 when not searched.
  std::int64_t found_max_micro_batch = -1;
  std::vector<std::pair<std::int64_t, bool>> search;  ///< (micro-batch, ran without running out of memory)

  // The memory ladder (the header): empty without oom_backoff's rungs.
  std::int64_t model_blocks = 0;       ///< blocks checkpointing can take (0: no checkpoint rung probed)
  double checkpointed_held = 0;        ///< a with every block checkpointed
  double checkpointed_per_sample = 0;  ///< b with every block checkpointed
  int moment_bits = 0;                 ///< the recipe's AdamW moment bits (32 AdamW, 8 adamw8bit; 0 others)
  std::vector<MomentRung> moment_rungs;
  std::int64_t min_micro_batch = 1;  ///< oom_backoff's floor
  double rung_slack = 0;             ///< the largest reserved - peak of the rungs' probes (CUDA's limit)
  // The time model (seconds).
  double step_seconds = 0, micro_step_seconds = 0, sample_seconds = 0, checkpoint_sample_seconds = 0;
  /// The recipe's configuration and each saver alone at the recipe's micro-batch (checkpointing
  /// the ladder's quarter, half and all of the blocks; each moment rung), in ladder order.
  std::vector<LadderConfig> rungs;
  /// The least predicted time that fits at the recipe's batch (micro-batches from
  /// min_micro_batch to the recipe's): nullopt when nothing fits or no limit is known.
  std::optional<LadderConfig> cheapest;

  /// Whether rungs beyond the micro-batch were probed.
  bool has_ladder() const { return model_blocks > 0 || !moment_rungs.empty(); }
  /// Predicted peak allocated of a step at (batch, micro) with `blocks` checkpointed and
  /// moments in `bits` (0: as configured) or, `offload`, in host memory (with `bits` 0: the
  /// offload rung is probed with the recipe's bits only; trainer::Error for another), at the
  /// estimate's length.
  std::int64_t predict_on_rung(std::int64_t batch, std::int64_t micro, std::int64_t blocks, int bits,
                               bool offload = false) const;
  /// What the limit caps on that rung: the peak, plus the allocator's slack where reserved
  /// memory is capped (CUDA; the larger of the plain probes' fit and the rungs' probes').
  std::int64_t rung_limit_measure(std::int64_t batch, std::int64_t micro, std::int64_t blocks, int bits,
                                  bool offload = false) const;
  /// Predicted seconds of that step (0 when the probes' times are unknown).
  double predict_seconds(std::int64_t batch, std::int64_t micro, std::int64_t blocks, int bits,
                         bool offload = false) const;
  /// The moment rung probed for `bits` (offload: the offload rung); nullptr for none.
  const MomentRung* moment_rung(int bits, bool offload) const;
  /// The least predicted time at `batch` that fits limit * (1 - margin), micro-batches from
  /// `min_micro` to `max_micro`, over the rungs probed; nullopt when none fits or no limit. Of
  /// the micro-batches that split the batch into as many micro-steps (as fast by the time
  /// model), the smallest: the batch split evenly, the most memory left.
  std::optional<LadderConfig> cheapest_fit(std::int64_t batch, std::int64_t max_micro, std::int64_t min_micro) const;

  /// Predicted peak allocated of a training step at (batch, micro-batch), at `length`.
  std::int64_t predict(std::int64_t batch, std::int64_t micro) const { return predict_at(batch, micro, length); }
  /// The same at sequence length `len` (0 without a length axis).
  std::int64_t predict_at(std::int64_t batch, std::int64_t micro, std::int64_t len) const;
  /// Predicted peak allocated of an evaluation at `eval_batch` (0 when not measured), at `length`.
  std::int64_t predict_eval(std::int64_t eval_batch) const { return predict_eval_at(eval_batch, length); }
  std::int64_t predict_eval_at(std::int64_t eval_batch, std::int64_t len) const;
  /// Whether an evaluation at `eval_batch` fits limit * (1 - margin) (true when unmeasured or
  /// the limit is unknown).
  bool eval_fits_at(std::int64_t eval_batch) const;
  /// The largest evaluation batch that fits (0: none does; -1: not measured or no limit).
  std::int64_t max_eval_batch() const;
  /// Predicted reserved at (batch, micro-batch).
  std::int64_t predict_reserved(std::int64_t batch, std::int64_t micro) const {
    return predict_reserved_at(batch, micro, length);
  }
  std::int64_t predict_reserved_at(std::int64_t batch, std::int64_t micro, std::int64_t len) const;
  /// Whether (batch, micro-batch) fits limit * (1 - margin); true when the limit is unknown.
  bool fits_at(std::int64_t batch, std::int64_t micro) const;
  /// The same at sequence length `len`.
  bool fits_at_length(std::int64_t batch, std::int64_t micro, std::int64_t len) const;
};

/// The micro-batches probed by default for a recipe's micro-batch: a quarter of it (at least
/// 4, never above it), its half and its quarter (16, 32, 64 for 256).
std::vector<std::int64_t> default_probe_sizes(std::int64_t micro);

/// Runs the probes and fits. Throws ConfigError/UsageError/PluginError for a recipe that does
/// not load, trainer::Error when a probe fails for another reason than memory.
MemoryEstimate estimate_memory(const EstimateRequest& request);

/// --find-max-batch: searches the largest micro-batch (batch = micro-batch) whose steps run
/// inside the limit, with real steps, starting from the prediction. Needs a budget on the CPU
/// (UsageError otherwise: the search would run the host out of memory).
void find_max_batch(const EstimateRequest& request, MemoryEstimate& estimate);

/// The report printed by `trainer estimate` (text or JSON).
void print_estimate(const MemoryEstimate& e, std::ostream& out);
void print_estimate_json(const MemoryEstimate& e, std::ostream& out);
/// Reads what print_estimate_json wrote (the fit, the limit, the probes, the evaluation), as
/// `trainer sweep` does with `trainer estimate --json`; throws trainer::Error when unreadable.
MemoryEstimate estimate_from_json(const std::string& text);

/// What a memory estimate depends on among `overrides` ("key=value", "+key=value"): configs
/// with equal keys share one estimate. Left out: the keys whose KeySpec in `sections` (the
/// config's core and plugin sections) is memory_neutral(): the batch sizes (the fit covers
/// them), the learning rate, the schedule, run.seed, training.epochs, max_steps, log_every,
/// checkpoint.* and the mlflow plugin's own keys, each declared so beside its key (a plugin's
/// `priority` and `policy` count: the order of plugins may change what they hold). A key not found there
/// (a section's own name, `model=cnn`) counts, as do optim.momentum and optim.weight_decay: SGD
/// keeps a momentum buffer only when momentum is not 0, and weight decay adds a temporary to its
/// step.
std::string memory_key(const std::vector<std::string>& overrides, const std::vector<SectionSpec>& sections);
/// The same with the sections of `run` (the core's for its config, and its plugins').
std::string memory_key(const std::vector<std::string>& overrides, const PreparedRun& run);

/// One row of the predicted breakdown beside a measured one.
struct BreakdownRow {
  std::string name;
  std::int64_t predicted = 0;
  std::int64_t measured = 0;
};

/// The breakdown `e` predicts for a step at (batch, micro) beside `measured`, the live memory by
/// category at a real step's highest point (memory.jsonl's "peak"): parameters and buffers,
/// optimizer state, the data held on the device (the estimate's memory at the start besides the
/// model; the category "dataset"), the step's own memory (gradients, activations, temporaries and
/// the batch: at the peak, inside a backward, the gradients it creates still count as "other",
/// so they are one row), and the step's peak.
std::vector<BreakdownRow> compare_breakdown(const MemoryEstimate& e, std::int64_t batch, std::int64_t micro,
                                            const MemoryBreakdown& measured);

/// "micro-batch 16 with 6 of 12 blocks checkpointed, AdamW's moments in 16 bits (inexact)",
/// "micro-batch 32 with AdamW's moments in host memory".
std::string describe_config(const MemoryEstimate& e, const LadderConfig& c);
/// "est. 1.21x step time" ("step time unknown" for 0).
std::string ratio_text(double ratio);

/// "peak = 50 MiB + 412 KiB x micro-batch + 3 KiB x batch": the fitted model, for messages.
std::string describe_fit(const MemoryEstimate& e);

}  // namespace trainer::tune
