#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/data.h"
#include "trainer/export.h"
#include "trainer/registry.h"

namespace trainer {

/// What a run learns: the loss of the model's outputs against the targets, and the metrics
/// that summarise them. `[task] name` picks one from the task registry ("classification",
/// "multilabel", "regression", or one a plugin registers); its keys join the [task] section.
///
/// Metrics are exact sums over samples: each sample's statistics are a row of doubles
/// (eval_rows()), the core writes every evaluated sample's row into its place in one table
/// (a retry after an out-of-memory error rewrites the same rows; in a data-parallel run each
/// rank writes its own rows and the tables are added up, zeros elsewhere), and evaluate()
/// computes the metrics from the whole table. Training metrics are column sums over the
/// samples of a logging window (train_sums()).
class TRAINER_API Task {
 public:
  virtual ~Task() = default;

  /// Outputs per sample the model must produce ([N, outputs()] from a batch of N); with
  /// token_outputs(), per token: [N, L, K] for inputs of L tokens, K at least outputs() (a
  /// model's vocabulary may hold more ids than its tokenizer gives).
  virtual std::int64_t outputs() const = 0;
  /// Whether the model's outputs are per token ([N, L, K], e.g. masked language modelling's
  /// logits over the vocabulary) rather than per sample. The model is told through
  /// DataSpec::token_outputs. Default false.
  virtual bool token_outputs() const { return false; }

  /// Per-sample losses [N] (float, differentiable) of `outputs` [N, outputs()] against
  /// `targets` as the dataset gives them. The core trains on their mean over the micro-batch,
  /// scaled by its share of the batch, so that micro-batches add up to the batch's mean.
  virtual at::Tensor sample_losses(const at::Tensor& outputs, const at::Tensor& targets) const = 0;
  /// The mean of sample_losses() over the micro-batch (a one-element tensor), what the step
  /// trains on. A task may compute it in one fused kernel; it must equal that mean. With
  /// sample_weights(), the weighted mean: sum of weight × loss over sum of weights (0 when the
  /// weights add up to 0), which the default computes.
  virtual at::Tensor mean_loss(const at::Tensor& outputs, const at::Tensor& targets) const;
  /// Each sample's weight in the batch's loss ([N], integer or float, on the targets' device;
  /// at least 0), or undefined (the default): every sample weighs 1. With weights, the core
  /// scales each micro-batch's mean_loss() by its share of the batch's weight instead of its
  /// share of the samples, so that the batch's loss is its weighted mean however it is split
  /// into micro-batches (an out-of-memory retry) or ranks. Masked language modelling weighs a
  /// sample by its masked tokens: the loss is the mean over the batch's masked tokens, as
  /// transformers computes it over a whole batch.
  virtual at::Tensor sample_weights(const at::Tensor& targets) const {
    (void)targets;
    return {};
  }

  /// Width of a training statistics row; names of the training metrics come from train_metrics().
  virtual std::int64_t train_width() const = 0;
  /// Column sums over the micro-batch's samples of the training statistics [train_width()],
  /// on the outputs' device (no gradient), in double or an integer type (the core adds them up
  /// in double). E.g. classification: [correct].
  virtual at::Tensor train_sums(const at::Tensor& outputs, const at::Tensor& targets) const = 0;
  /// The training metrics (without the "train/" prefix; "loss" is the core's) of a window of
  /// `samples` samples whose train_sums() add up to `sums` (CPU, double).
  virtual std::map<std::string, double> train_metrics(const at::Tensor& sums, std::int64_t samples) const = 0;

  /// Width of an evaluation row. Column 0 is the sample's loss (sample_losses()).
  virtual std::int64_t eval_width() const = 0;
  /// One row per sample [N, eval_width()], double, on the outputs' device (no gradient).
  virtual at::Tensor eval_rows(const at::Tensor& outputs, const at::Tensor& targets) const = 0;
  /// The evaluation metrics (without the "eval/" prefix) of every evaluated sample's row
  /// [n, eval_width()] (CPU, double, in sample order). "loss" is the mean of column 0, which
  /// the core adds unless the task gives it (a task with sample_weights() gives the weighted
  /// mean).
  virtual std::map<std::string, double> evaluate(const at::Tensor& rows) const = 0;
};

/// Builds a task from its config section (`task.*`), the dataset's spec and a few of its
/// training samples (`probe`: their targets show the targets' type and shape). Throws
/// UsageError when the data does not fit the task, naming dataset, task and what is allowed.
using TaskFactory =
    std::function<std::unique_ptr<Task>(const Config& section, const DataSpec& data, const Batch& probe)>;

/// The process-wide task registry (built-ins: "classification", "multilabel", "regression",
/// "masked_lm").
TRAINER_API Registry<TaskFactory>& task_registry();

/// Per-sample losses [N] (float, differentiable) of outputs [N, K] against targets.
using SampleLoss = std::function<at::Tensor(const at::Tensor& outputs, const at::Tensor& targets)>;

/// The built-in "classification" task (its checks of the data, its training and evaluation
/// metrics and its keys' meaning) with another loss: a plugin's task that only changes the
/// loss (focal, hinge…) is this. `section` holds classification's keys
/// (classification_task_keys(); class_weights and label_smoothing only shape the default
/// loss). An empty `loss` is cross-entropy.
TRAINER_API std::unique_ptr<Task> classification_task(const Config& section, const DataSpec& data, const Batch& probe,
                                                      SampleLoss loss = {});
/// The keys of the "classification" task, for a registry entry built on classification_task().
TRAINER_API std::vector<KeySpec> classification_task_keys();

/// The task `cfg.task.name` for `dataset`'s data (`probe` as for TaskFactory: its first
/// samples), with `spec` (the training split's, for a test split) or the dataset's own.
TRAINER_API std::unique_ptr<Task> make_task(const Config& cfg, const Dataset& dataset, const DataSpec* spec = nullptr);

}  // namespace trainer
