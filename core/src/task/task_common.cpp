// What the built-in tasks share: the refusal of data, F1, means, and a loss scripted in Python.
#include "task/task_common.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>

#include "model/torchscript.h"
#include "trainer/error.h"

namespace trainer::detail {

at::Tensor widened(const at::Tensor& outputs) {
  return outputs.scalar_type() == at::kDouble ? outputs : outputs.to(at::kFloat);
}

std::string refusal(const std::string& task, const Batch& probe) {
  return fmt::format("task.name = \"{}\": the dataset's targets are {} of shape [{}] (per batch)", task,
                     c10::toString(probe.targets.scalar_type()), fmt::join(probe.targets.sizes(), ", "));
}

double mean_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

std::optional<double> f1(double tp, double fp, double fn) {
  const double d = 2.0 * tp + fp + fn;
  if (d == 0.0) return std::nullopt;
  return 2.0 * tp / d;
}

SampleLoss scripted_loss(const std::string& path, const std::vector<std::pair<const char*, bool>>& own) {
  if (path.empty()) return {};
  for (const auto& [key, set] : own) {
    TRAINER_CHECK_T(UsageError, !set, "task.", key, " shapes the task's own loss, which task.loss_path = \"", path,
                    "\" replaces: leave task.", key, " at its default");
  }
  return load_torchscript_loss("task.loss_path", path);
}

void try_scripted_loss(const Task& task, const Batch& probe, const std::string& path) {
  const at::Tensor outputs = at::zeros({probe.targets.size(0), task.outputs()}).requires_grad_().mul(1);
  try {
    (void)task.sample_losses(outputs, probe.targets);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  } catch (const c10::Error& e) {
    throw UsageError(fmt::format("task.loss_path = \"{}\": the loss failed on the dataset's first samples: {}", path,
                                 e.what_without_backtrace()));
  }
}

}  // namespace trainer::detail
