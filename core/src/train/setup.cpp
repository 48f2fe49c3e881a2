#include "train/setup.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "data/epoch_order.h"
#include "memory/backend.h"
#include "model/deferred_init.h"
#include "train/checkpoint_files.h"
#include "train/hooks.h"
#include "train/memory_format.h"
#include "train/runtime_threads.h"
#include "trainer/devices.h"
#include "trainer/distributed.h"
#include "trainer/error.h"
#include "trainer/memory.h"
#include "trainer/runtime.h"

namespace trainer {

std::unique_ptr<MetricsLogger> make_metrics(const MetricsSettings& s, const std::string& run_dir,
                                            std::shared_ptr<spdlog::logger> log) {
  auto metrics = std::make_unique<MetricsLogger>(log);
  if (s.jsonl) metrics->add_sink(std::make_shared<JsonlSink>(run_dir + "/metrics.jsonl"));
  if (s.console) metrics->add_sink(std::make_shared<ConsoleSink>(log));
  return metrics;
}

void setup_runtime(RunParts& parts, const RuntimeSettings& s, std::int64_t seed, int local_ranks, spdlog::logger& log) {
  parts.threads = std::make_unique<RuntimeThreads>(s.num_threads, local_ranks, log);
  const int n = parts.threads->threads();
  if (s.tune_malloc && !tune_cpu_allocator()) {
    log.warn("runtime.tune_malloc: the C library refused the malloc settings; running untuned");
  }
  torch::manual_seed(static_cast<std::uint64_t>(seed));
  log.info("threads: {}, seed: {}, LibTorch {}", n, seed, TORCH_VERSION);
  check_blas(log);
}

void check_cuda_device(const c10::Device& d, const std::string& what) {
  const auto n = static_cast<int>(torch::cuda::device_count());
  TRAINER_CHECK((d.has_index() ? d.index() : 0) < n, what, " ", d.str(), ": this process sees ", n, " CUDA device(s)",
                n == 0 ? " (this LibTorch has no CUDA, or no GPU is visible)" : "");
}

c10::Device select_device(Hooks& hooks, const RuntimeSettings& s) {
  const auto requested = parse_device_setting(s.device);
  TRAINER_CHECK_T(UsageError, requested, "runtime.device = \"", s.device, "\": must be ", device_setting_check().rule);
  EventContext& ctx = hooks.context();
  ctx.device = c10::Device(requested->str());
  // In a data-parallel launch, plain "cuda" is each rank's own GPU: cuda:<LOCAL_RANK>, or the
  // one GPU a rank sees when its launcher gave each rank its own (CUDA_VISIBLE_DEVICES per rank).
  if (const auto local = local_rank_of_this_process(); local >= 0 && s.device == "cuda") {
    const auto visible = static_cast<std::int64_t>(torch::cuda::device_count());
    if (local < visible) ctx.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local));
  }
  const Control c = hooks.fire(Event::SelectDevice);
  if (c.switch_device) ctx.device = c10::Device(*c.switch_device);
  if (ctx.device.is_cuda()) check_cuda_device(ctx.device, "device");
  return ctx.device;
}

MemoryBudget::MemoryBudget(const c10::Device& device, const MemorySettings& s, spdlog::logger& log)
    : categories_before_(has_memory_categories(c10::kCPU)) {
  TRAINER_CHECK_T(UsageError, s.limit_mb == 0 || s.fraction == 0,
                  "memory.limit_mb and memory.fraction are both set; set one of them");
  // The categories switch only once nothing else here can throw: a constructor that throws
  // has no destructor to switch them back.
  if (!has_memory_backend(device)) {
    TRAINER_CHECK_T(UsageError, s.limit_mb == 0 && s.fraction == 0, "memory.limit_mb/memory.fraction on ", device.str(),
                    " need its memory backend, which this build does not have");
    set_memory_categories(s.categories);
    return;
  }
  detail::set_run_memory_tag(MemoryCategory::Other, 0);  // not the last run's last phase
  // A GPU's allocator is followed from before its budget: the first matrix products (cuBLAS's
  // workspace, made then) run while there is room.
  std::string why;
  const bool tracked = !s.categories || detail::track_memory_categories(device, &why);
  previous_ = memory_stats(device).limit;
  device_ = device;
  try {
    if (s.fraction > 0) {
      set_memory_fraction(device, s.fraction);
    } else {
      set_memory_limit(device, static_cast<std::int64_t>(s.limit_mb * 1024.0 * 1024.0));
    }
  } catch (...) {
    set_memory_limit(device, previous_);
    throw;
  }
  set_memory_categories(s.categories);
  if (!tracked) log.info("memory by category on {}: not available ({})", device.str(), why);
  if (const std::int64_t limit = memory_stats(device).limit; limit > 0) {
    log.info("memory budget: {} on {}", format_bytes(limit), device.str());
  }
}

MemoryBudget::~MemoryBudget() {
  set_memory_categories(categories_before_);
  detail::set_run_memory_tag(MemoryCategory::Other, 0);
  if (!device_) return;
  try {
    set_memory_limit(*device_, previous_);
  } catch (...) {
    // Nothing to do at the end of a run: the next run sets its own budget.
  }
}

void setup_data(RunParts& parts, const Config& cfg, bool with_test_split, spdlog::logger& log) {
  const MemoryCategoryScope held(MemoryCategory::Dataset);  // what the data sets keep in memory
  const Config section = cfg.sub("dataset");
  const std::string name = cfg.get<std::string>("dataset.name");
  auto factory = dataset_registry().get(name).factory;
  parts.train_set = factory(section, Split::Train);
  if (with_test_split) parts.test_set = factory(section, Split::Test);
  log.info("dataset {}: {} train, {} test samples", name, parts.train_set->size(),
           parts.test_set ? parts.test_set->size() : 0);
  parts.task_name = cfg.get_or<std::string>("task.name", "classification");
  // A dataset whose targets are per token (masked language modelling) needs a task that reads
  // them so: another would misread them (a width taken from the first batch) or refuse them
  // with advice that does not help.
  const bool per_token = parts.train_set->spec().token_outputs;
  const auto per_token_refusal = [&](const std::string& why) {
    return UsageError(
        fmt::format("dataset {} gives a target per token (masked language modelling: "
                    "dataset.masked_lm = true), which task.name = \"masked_lm\" reads; task '{}'{}",
                    name, parts.task_name, why));
  };
  // A scripted loss is code the user wrote, run as it is (trainer reads every other file as data).
  const std::string loss_path = cfg.get_or<std::string>("task.loss_path", "");
  if (!loss_path.empty()) log.info("task.loss_path: runs the code in {} (a TorchScript loss is a program)", loss_path);
  try {
    parts.task = make_task(cfg, *parts.train_set);
  } catch (const UsageError& e) {
    if (per_token) throw per_token_refusal(std::string(": ") + e.what());
    throw;
  }
  if (per_token && !parts.task->token_outputs()) throw per_token_refusal(" reads one target per sample");
  if (parts.test_set && parts.test_set->size() > 0) {
    // The test split's targets must fit the same task (with the training split's classes), with
    // the same outputs.
    const DataSpec train_spec = parts.train_set->spec();
    std::unique_ptr<Task> test;
    try {
      test = make_task(cfg, *parts.test_set, &train_spec);
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("dataset {}, its test split: {}", name, e.what()));
    }
    TRAINER_CHECK_T(UsageError, test->outputs() == parts.task->outputs(), "dataset ", name, ": its test split needs ",
                    test->outputs(), " model outputs per sample for task '",
                    cfg.get_or<std::string>("task.name", "classification"), "', its training split ",
                    parts.task->outputs());
  }
}

/// `model.weights` as a file: itself. As a run directory (or its checkpoints/ directory): the
/// checkpoint `latest` names, or the newest complete `step_<N>.pt` when that one is not complete
/// (each one passed over is warned about, as `--resume` does).
static std::string weights_file(const std::string& path, spdlog::logger& log) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return path;
  std::vector<std::string> passed;  // "file: why"
  for (const auto& file : resume_candidates(path, "model.weights").files) {
    const std::optional<std::string> problem = checkpoint_problem(file);
    if (!problem) return file;
    log.warn("model.weights: checkpoint {} is truncated or damaged: {}", file, *problem);
    passed.push_back(file + ": " + *problem);
  }
  throw UsageError(fmt::format("model.weights = \"{}\": no complete checkpoint in this run directory ({})", path,
                               fmt::join(passed, "; ")));
}

void setup_model(RunParts& parts, Hooks& hooks, const Config& cfg, bool resuming, spdlog::logger& log) {
  // The weights and buffers, whatever a plugin builds or loads in ModelCreated; the core
  // attributes them again by identity once they are on the device.
  const MemoryCategoryScope weights(MemoryCategory::Parameters);
  const Config section = cfg.sub("model");
  // The model's outputs per sample are what the task needs (the classes, labels or targets).
  DataSpec spec = parts.train_set->spec();
  spec.num_classes = parts.task->outputs();
  spec.token_outputs = parts.task->token_outputs();
  // A model written in Python is code the user wrote, run as it is (trainer reads every other
  // file as data): said before LibTorch's reader runs it.
  if (section.get_or<std::string>("name", "") == "torchscript") {
    log.info("model = \"torchscript\": runs the code in {} (a TorchScript model is a program)",
             section.get_or<std::string>("path", ""));
  }
  {
    // A model that reads its weights from a file itself (model "bert" with model.path) builds
    // them on the run's device and reads the file into them there: no copy on the host.
    detail::LoadOnto onto(parts.device);
    parts.model = build_model(section, spec);
  }
  const ModelSettings settings = ModelSettings::from(section);
  parts.input_dtype = model_dtype(settings.dtype);
  if (!settings.weights.empty()) {
    // Resuming, the checkpoint holds the model, or (a run that trains part of it: LoRA, a probe)
    // what trained over the frozen weights these give; without them it must hold all of it.
    try {
      const std::string file = weights_file(settings.weights, log);
      const WeightsReport r = load_weights(*parts.model, file, settings.weights_exclude);
      log.info("model weights: {} tensors from {} ({}){}{}", r.loaded, file, r.format,
               r.excluded.empty()
                   ? std::string()
                   : ", " + std::to_string(r.excluded.size()) + " kept at their initial values (model.weights_exclude)",
               resuming ? "; the checkpoint resumed from goes over them" : "");
      parts.base_from_file = true;
    } catch (const UsageError& e) {
      if (!resuming) throw;
      parts.weights_note = fmt::format("model.weights = \"{}\" was not loaded: {}", settings.weights, e.what());
      log.warn("model weights: {} not loaded ({}); the checkpoint resumed from must hold the whole model",
               settings.weights, e.what());
    }
  }
  // A model that reads its weights itself (model "torchscript", "bert" with model.path).
  if (section.has("path") && !section.get<std::string>("path").empty()) {
    parts.base_from_file = true;
  }
  EventContext& ctx = hooks.context();
  ctx.model = parts.model;
  ctx.train_set = parts.train_set;
  ctx.test_set = parts.test_set;
  hooks.fire(Event::ModelCreated);
  TRAINER_CHECK(ctx.model != nullptr, "a plugin cleared the model in ModelCreated");
  TRAINER_CHECK(ctx.train_set != nullptr, "a plugin cleared the training set in ModelCreated");
  TRAINER_CHECK((ctx.test_set != nullptr) == (parts.test_set != nullptr), "a plugin in ModelCreated ",
                parts.test_set ? "cleared the test set" : "added a test set to a run without evaluation");
  parts.model = ctx.model;
  parts.train_set = ctx.train_set;
  parts.test_set = ctx.test_set;
  parts.model->to(parts.device);
  if (section.has("memory_format")) {
    choose_memory_format(parts, section.get<std::string>("memory_format"),
                         TrainingSettings::from(cfg.sub("training")).micro_batch(), log);
  }
  parts.model->train();
  hooks.fire(Event::ModelToDevice);
  std::int64_t nparams = 0, trainable = 0;
  for (const auto& p : parts.model->parameters()) {
    nparams += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
  log.info("model {}: {} parameters, {} trainable", cfg.get<std::string>("model.name"), nparams, trainable);
}

void check_outputs(const at::Tensor& outputs, const Task& task) {
  if (task.token_outputs()) {
    TRAINER_CHECK_T(UsageError, outputs.dim() == 3 && outputs.size(2) >= task.outputs(), "the model's outputs are ",
                    outputs.sizes(), "; the task needs one row per token, [N, L, K] with K at least ", task.outputs(),
                    " (a model sees DataSpec::token_outputs and sizes its rows from DataSpec::num_classes)");
    return;
  }
  TRAINER_CHECK_T(UsageError, outputs.dim() == 2 && outputs.size(1) == task.outputs(), "the model's outputs are ",
                  outputs.sizes(), "; the task needs [N, ", task.outputs(),
                  "] (a model sizes its head from DataSpec::num_classes, the outputs per sample the task needs)");
}

Batch to_device(const RunParts& parts, const Batch& b) {
  const bool nhwc = parts.memory_format == c10::MemoryFormat::ChannelsLast && b.inputs.dim() == 4;
  // Token ids (integers) stay integers; floating inputs take the model's dtype.
  const c10::ScalarType dtype = b.inputs.is_floating_point() ? parts.input_dtype : b.inputs.scalar_type();
  if (b.inputs.device() == parts.device && b.inputs.scalar_type() == dtype && b.targets.device() == parts.device &&
      (!nhwc || b.inputs.is_contiguous(c10::MemoryFormat::ChannelsLast))) {
    return b;
  }
  at::Tensor inputs = b.inputs.to(parts.device, dtype);
  if (nhwc) inputs = inputs.contiguous(c10::MemoryFormat::ChannelsLast);
  return {inputs, b.targets.to(parts.device)};
}

void setup_optimizer(RunParts& parts, Hooks& hooks, const Config& cfg) {
  std::vector<at::Tensor> params;
  for (const auto& p : parts.model->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  parts.optim = optimizer_registry().get(cfg.get<std::string>("optim.name")).factory(cfg.sub("optim"), params);
  hooks.context().optimizer = parts.optim.get();
  hooks.fire(Event::OptimizerCreated);
}

namespace {

/// training.group_by_length: the training set must give each sample's length. Logs the tokens
/// the first epoch computes per token of its samples, grouped and in the order without grouping.
void check_length_groups(const Dataset& train, const TrainingSettings& training, std::int64_t seed, const Config& cfg,
                         spdlog::logger& log) {
  if (!training.group_by_length) return;
  const at::Tensor lengths = train.lengths();
  const std::string dataset = cfg.has("dataset.name") ? cfg.get<std::string>("dataset.name") : std::string("?");
  TRAINER_CHECK_T(UsageError, lengths.defined(), "training.group_by_length = true: the training set (dataset '",
                  dataset,
                  "', as plugins left it) gives no sample lengths; it groups the samples of a dataset that has them "
                  "(\"text\")");
  TRAINER_CHECK(lengths.dim() == 1 && lengths.size(0) == train.size(), "dataset '", dataset, "': lengths() gave ",
                lengths.sizes(), " for ", train.size(), " samples");
  const at::Tensor plain = detail::epoch_order(train.size(), training.shuffle, seed, 0, {}, training.batch_size);
  const at::Tensor grouped = detail::group_by_length(plain, lengths, training.batch_size);
  const auto before = detail::padded_tokens(plain, lengths, training.batch_size);
  const auto after = detail::padded_tokens(grouped, lengths, training.batch_size);
  const auto ratio = [](const detail::PaddedTokens& t) {
    return t.real > 0 ? static_cast<double>(t.computed) / static_cast<double>(t.real) : 1.0;
  };
  log.info(
      "training.group_by_length: batches of samples of similar length, the longest sample in the first; the first "
      "epoch's batches of {} hold {:.3f} tokens per token of their samples (padding included), {:.3f} without grouping",
      training.batch_size, ratio(after), ratio(before));
}

}  // namespace

void plan_steps(RunParts& parts, RunState& state, const TrainingSettings& training, std::int64_t seed,
                const Config& cfg, spdlog::logger& log) {
  check_length_groups(*parts.train_set, training, seed, cfg, log);
  state.batch_size = training.batch_size;
  state.micro_batch_size = training.micro_batch();
  state.num_epochs = training.epochs;
  const std::int64_t n = parts.train_set->size();
  const std::int64_t bs = training.batch_size;
  state.steps_per_epoch = n / bs + (!training.drop_last && n % bs != 0 ? 1 : 0);  // no n + bs - 1 to overflow
  TRAINER_CHECK_T(UsageError, state.steps_per_epoch > 0, "training.batch_size = ", training.batch_size,
                  " with drop_last leaves no batch of ", n, " samples");
  TRAINER_CHECK_T(UsageError, !__builtin_mul_overflow(state.steps_per_epoch, training.epochs, &state.total_steps),
                  "training.epochs = ", training.epochs, " times ", state.steps_per_epoch,
                  " steps per epoch is more optimizer steps than a 64-bit counter holds; use fewer epochs");
  if (training.max_steps > 0) state.total_steps = std::min(state.total_steps, training.max_steps);
  parts.schedule = schedule_registry()
                       .get(cfg.get<std::string>("sched.name"))
                       .factory(cfg.sub("sched"), get_learning_rate(*parts.optim), state.total_steps);
}

}  // namespace trainer
