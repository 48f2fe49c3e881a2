#pragma once
// Private: what the built-in tasks share (task_common.cpp), and the factories of the tasks
// "multilabel" (multilabel.cpp) and "regression" (regression.cpp).
#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/settings.h"
#include "trainer/task.h"

namespace trainer::detail {

/// Losses are computed in float32 at least: a bfloat16/half output (autocast) is widened first,
/// a float64 model keeps float64.
at::Tensor widened(const at::Tensor& outputs);

/// What a task's refusal of the data starts with: the targets' dtype and shape.
std::string refusal(const std::string& task, const Batch& probe);

double mean_of(const std::vector<double>& v);

/// F1 of one class or label from its counts; nullopt when it has neither targets nor
/// predictions (a class then is left out of a macro average, as scikit-learn leaves out a
/// class absent from targets and predictions; a label scores 0).
std::optional<double> f1(double tp, double fp, double fn);

/// The help of each task's key loss_path, before what its targets are.
inline constexpr const char* kLossPathHelp =
    "A loss scripted in Python (torch.jit.script(loss).save(path)) in place of the task's own: forward(outputs, "
    "targets) returns each sample's loss [N]; the task's checks of the data and its metrics stay";

/// The loss scripted in `path` (none when empty). `own` names the task's keys that shape its own
/// loss and whether each is away from its default: such a key is refused beside it (it would
/// change nothing). Values, not where they came from, decide: a run's config.toml repeats every
/// default.
SampleLoss scripted_loss(const std::string& path, const std::vector<std::pair<const char*, bool>>& own);

/// The first call of a scripted loss, at setup rather than at the first step: float32 outputs of
/// zeros [n, outputs] with a gradient (computed from a leaf, as a model's are) against the
/// probe's targets, as the task passes them on. The run's device, dtype and evaluation (no
/// gradient) are met at the first step.
void try_scripted_loss(const Task& task, const Batch& probe, const std::string& path);

/// The task "multilabel" of the section `task`, and its keys.
std::unique_ptr<Task> multilabel_task(const Config& section, const Batch& probe);
std::vector<KeySpec> multilabel_task_keys();

/// The task "regression" of the section `task`, and its keys.
std::unique_ptr<Task> regression_task(const Config& section, const Batch& probe);
std::vector<KeySpec> regression_task_keys();

}  // namespace trainer::detail
