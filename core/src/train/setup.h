#pragma once
// Private: building a run, in the order fit() does it: the runtime, the device (with its
// memory budget), the data, the model and the optimizer, and the plan of steps.
#include <c10/core/Device.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "trainer/config.h"
#include "trainer/context.h"
#include "trainer/core_settings.h"
#include "trainer/data.h"
#include "trainer/distributed.h"
#include "trainer/metrics.h"
#include "trainer/model.h"
#include "trainer/optim.h"
#include "trainer/task.h"

namespace spdlog {
class logger;
}

namespace trainer {

class Hooks;
class BatchLoader;
class RuntimeThreads;

/// What set-up builds; the rooms of the loop act on it.
struct RunParts {
  std::shared_ptr<Dataset> train_set;
  std::shared_ptr<Dataset> test_set;  ///< null when the run never evaluates (eval.every_epochs = 0)
  /// Reads train_set's batches ahead of the step ([loader]); made once the datasets are final.
  std::shared_ptr<BatchLoader> loader;
  /// [task]: the loss and the metrics, for the training split's targets (setup_data).
  std::shared_ptr<const Task> task;
  std::string task_name;  ///< task.name
  std::shared_ptr<Model> model;
  std::unique_ptr<torch::optim::Optimizer> optim;
  std::unique_ptr<LrSchedule> schedule;
  c10::Device device{c10::kCPU};              ///< where the run is (an OOM device fallback moves it)
  c10::ScalarType input_dtype = c10::kFloat;  ///< model.dtype: floating inputs are cast to it
  /// model.memory_format as chosen (train/memory_format.h): 4-D inputs are converted to it.
  c10::MemoryFormat memory_format = c10::MemoryFormat::Contiguous;
  /// The evaluation batch: eval.batch_size, or the size an out-of-memory retry settled on (kept
  /// in checkpoints, so a resumed run does not run out of memory where this one learnt better).
  std::int64_t eval_batch = 0;
  /// The model's weights come from files (model.weights, or the model's own model.path), so a
  /// run that trains part of it can checkpoint that part alone: the rest is read again.
  bool base_from_file = false;
  /// Resuming: why model.weights was not loaded ("" when it was, or none is set).
  std::string weights_note;
  /// The ranks of a data-parallel run (null in a run of one), and the size of the buckets its
  /// gradients are averaged in ([distributed]).
  std::shared_ptr<ProcessGroup> group;
  /// LibTorch's intra-op threads (runtime.num_threads; 0 adapts to the load at each epoch).
  std::shared_ptr<RuntimeThreads> threads;
  std::int64_t bucket_bytes = 25 << 20;
  bool overlap = true;  ///< the gradients' all-reduce starts inside the backward
  /// Whether this process writes the run's files (checkpoints, status.json, config.toml,
  /// metrics): rank 0, or the process of a run of one.
  bool writer() const { return !group || group->rank() == 0; }
};

/// The metric sinks [metrics] asks for: `<run_dir>/metrics.jsonl`, the console.
std::unique_ptr<MetricsLogger> make_metrics(const MetricsSettings& s, const std::string& run_dir,
                                            std::shared_ptr<spdlog::logger> log);

/// Threads (parts.threads, for one of `local_ranks` ranks of this host), malloc tuning, the global
/// seed; warns about a slow BLAS.
void setup_runtime(RunParts& parts, const RuntimeSettings& s, std::int64_t seed, int local_ranks, spdlog::logger& log);

/// Fires SelectDevice with runtime.device proposed (`cuda` = `cuda:0`) and returns the device
/// plugins chose; throws when this process cannot use that CUDA device.
c10::Device select_device(Hooks& hooks, const RuntimeSettings& s);

/// Throws unless this process can use CUDA device `d` (`what` names who asked).
void check_cuda_device(const c10::Device& d, const std::string& what);

/// The run's memory budget on its device (memory.limit_mb or memory.fraction), logged, and
/// whether memory is split into categories (memory.categories). The process gets its previous
/// limit and categories back when the budget dies: they are the run's.
class MemoryBudget {
 public:
  MemoryBudget(const c10::Device& device, const MemorySettings& s, spdlog::logger& log);
  ~MemoryBudget();
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

 private:
  std::optional<c10::Device> device_;  ///< where a budget was set
  std::int64_t previous_ = 0;          ///< the limit before
  bool categories_before_;             ///< memory categories were on before (memory.categories)
};

/// Loads the training split and, when `with_test_split`, the test split ([dataset]), and builds
/// the task ([task]) for their targets: UsageError when they do not fit it.
void setup_data(RunParts& parts, const Config& cfg, bool with_test_split, spdlog::logger& log);

/// Builds the model in its dtype ([model]), loads model.weights (`resuming`: the base a
/// checkpoint of what trained goes over; a weights file that is gone is then only logged, as
/// a checkpoint of the whole model needs none), fires
/// ModelCreated (plugins may replace it), moves it to parts.device once, applies
/// model.memory_format where the model has the key (a probe for "auto"), puts it in training
/// mode and fires ModelToDevice.
void setup_model(RunParts& parts, Hooks& hooks, const Config& cfg, bool resuming, spdlog::logger& log);

/// Throws UsageError unless `outputs` are [N, task.outputs()] (a model from a plugin sizes its
/// head from DataSpec::num_classes; one that does not would index past the task's classes).
void check_outputs(const at::Tensor& outputs, const Task& task);

/// `b` on the run's device, inputs in the model's input dtype and memory format.
Batch to_device(const RunParts& parts, const Batch& b);

/// Builds the optimizer ([optim]) over the parameters that require grad and fires
/// OptimizerCreated.
void setup_optimizer(RunParts& parts, Hooks& hooks, const Config& cfg);

/// Fills the plan into `state` (batch sizes, steps per epoch, total steps) and builds the LR
/// schedule ([sched]) over it. Throws UsageError when drop_last leaves no batch.
/// With training.group_by_length it checks that the training set's samples have lengths and
/// logs the padding the first epoch's order saves.
void plan_steps(RunParts& parts, RunState& state, const TrainingSettings& training, std::int64_t seed,
                const Config& cfg, spdlog::logger& log);

}  // namespace trainer
