#include "trainer/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <thread>

#include "trainer/event_bus.h"
#include "trainer/json.h"
#include "trainer/logging.h"
#include "trainer/memory.h"
#include "trainer/optim.h"
#include "trainer/plugin_host.h"
#include "trainer/recipe.h"
#include "train/signal_scope.h"
#include "trainer/runtime.h"
#include "util/local_time.h"

namespace fs = std::filesystem;

namespace trainer {

namespace {

/// Writes `text` to `path` through a temporary file and a rename: never half-written.
void write_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TRAINER_CHECK(out.good(), "cannot write ", tmp.string());
    out << text;
    out.flush();
    TRAINER_CHECK(out.good(), "short write to ", tmp.string());
  }
  fs::rename(tmp, path);
}

std::string timestamp() { return detail::local_time("%Y%m%d-%H%M%S"); }

/// Throws unless this process can use CUDA device `d` (`what` names who asked).
void check_cuda_device(const c10::Device& d, const std::string& what) {
  const auto n = static_cast<int>(torch::cuda::device_count());
  TRAINER_CHECK((d.has_index() ? d.index() : 0) < n, what, " ", d.str(), ": this process sees ", n, " CUDA device(s)",
                n == 0 ? " (this LibTorch has no CUDA, or no GPU is visible)" : "");
}

std::int64_t scalar(torch::serialize::InputArchive& ar, const std::string& key) {
  at::Tensor t;
  ar.read(key, t);
  return t.item<std::int64_t>();
}

/// An exception's message without LibTorch's C++ backtrace.
std::string error_text(const std::exception& e) {
  if (const auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}

/// Stops a run that a plugin, max_steps or a signal ended early (not a failure).
struct StopRun {};

}  // namespace

struct Trainer::Impl {
  TrainerOptions opts;
  const Config& cfg;
  std::shared_ptr<spdlog::logger> log;
  std::unique_ptr<EventBus> bus;
  std::unique_ptr<MetricsLogger> metrics;
  std::string run_dir;

  std::shared_ptr<Dataset> train_set, test_set;
  std::shared_ptr<Model> model;
  std::unique_ptr<torch::optim::Optimizer> optim;
  std::unique_ptr<LrSchedule> schedule;
  c10::Device device{c10::kCPU};

  // Settings.
  std::int64_t epochs = 1, batch_size = 1, micro_batch_size = 1, max_steps = 0, log_every = 50, seed = 0;
  std::int64_t eval_every = 1, eval_batch = 1000, ckpt_every_epochs = 1, ckpt_every_steps = 0, keep_last = 2;
  double clip = 0.0;
  bool shuffle = true, drop_last = false, ckpt_at_end = true;

  // Progress.
  RunState st;
  EventContext ctx;
  std::int64_t start_epoch = 0, start_batch = 0;
  std::int64_t epochs_completed = 0;
  bool want_stop = false, want_checkpoint = false, want_eval = false;
  std::string stop_reason;
  std::string last_checkpoint;
  std::vector<std::string> checkpoints;
  double window_loss = 0.0;
  std::int64_t window_steps = 0, window_samples = 0;
  std::chrono::steady_clock::time_point window_start;
  double window_excluded_s = 0.0;  ///< eval and checkpoint time inside the window

  explicit Impl(TrainerOptions o) : opts(std::move(o)), cfg(opts.config) {}

  // --- events ------------------------------------------------------------------------
  /// Fires `e` with the persistent context; per-event pointers are cleared afterwards.
  Control fire(Event e) {
    Control control;
    ctx.event = e;
    ctx.state = st;
    // The per-event pointers refer to locals of the caller: clear them whatever happens.
    struct ClearEventPointers {
      EventContext& c;
      ~ClearEventPointers() {
        c.batch = nullptr;
        c.indices = nullptr;
        c.outputs = nullptr;
        c.loss = nullptr;
        c.eval_metrics = nullptr;
        c.oom = nullptr;
      }
    } clear{ctx};
    if (bus->subscribers(e) != 0) {
      bus->dispatch(ctx, control);
      if (control.any()) apply_control(e, control);
    }
    return control;
  }

  void apply_control(Event e, const Control& c) {
    const std::string why = c.reason.empty() ? "" : " (" + c.reason + ")";
    if (c.stop_training && !want_stop) {
      want_stop = true;
      stop_reason = "a plugin asked to stop in " + std::string(event_name(e)) + why;
      log->info("{}; stopping at the next safe point", stop_reason);
    }
    if (c.request_checkpoint) want_checkpoint = true;
    if (c.request_eval) want_eval = true;
    if (c.micro_batch_size) {
      if (e == Event::BatchStart || e == Event::BatchEnd) {
        const std::int64_t next = std::clamp<std::int64_t>(*c.micro_batch_size, 1, batch_size);
        if (next != micro_batch_size) {
          log->info("micro-batch {} -> {}{}", micro_batch_size, next, why);
          micro_batch_size = next;
        }
      } else {
        log->warn("micro_batch_size is honoured in BatchStart and BatchEnd only; ignored in {}", event_name(e));
      }
    }
    if (c.retry_with_micro_batch && e != Event::OutOfMemory) {
      log->warn("retry_with_micro_batch is honoured in OutOfMemory only; ignored in {}", event_name(e));
    }
    if (c.switch_device && e != Event::SelectDevice && e != Event::OutOfMemory) {
      log->warn("switch_device is honoured in SelectDevice and OutOfMemory only; ignored in {}", event_name(e));
    }
  }

  // --- set-up ------------------------------------------------------------------------
  void read_settings() {
    epochs = cfg.get<std::int64_t>("training.epochs");
    batch_size = cfg.get<std::int64_t>("training.batch_size");
    const auto mb = cfg.get<std::int64_t>("training.micro_batch_size");
    micro_batch_size = mb > 0 ? std::min(mb, batch_size) : batch_size;
    max_steps = cfg.get<std::int64_t>("training.max_steps");
    log_every = cfg.get<std::int64_t>("training.log_every");
    clip = cfg.get<double>("training.grad_clip_norm");
    shuffle = cfg.get<bool>("training.shuffle");
    drop_last = cfg.get<bool>("training.drop_last");
    seed = cfg.get<std::int64_t>("run.seed");
    eval_every = cfg.get<std::int64_t>("eval.every_epochs");
    eval_batch = cfg.get<std::int64_t>("eval.batch_size");
    ckpt_every_epochs = cfg.get<std::int64_t>("checkpoint.every_epochs");
    ckpt_every_steps = cfg.get<std::int64_t>("checkpoint.every_steps");
    keep_last = cfg.get<std::int64_t>("checkpoint.keep_last");
    ckpt_at_end = cfg.get<bool>("checkpoint.at_end");
  }

  void make_run_dir() {
    if (!opts.run_dir.empty()) {
      run_dir = opts.run_dir;
    } else {
      const fs::path base =
          fs::path(cfg.get<std::string>("run.dir")) / (cfg.get<std::string>("run.name") + "-" + timestamp());
      fs::path p = base;
      for (int i = 1; fs::exists(p); ++i) p = base.string() + "-" + std::to_string(i);
      run_dir = p.string();
    }
    std::error_code ec;
    fs::create_directories(fs::path(run_dir) / "checkpoints", ec);
    TRAINER_CHECK_T(UsageError, !ec, "cannot create run directory ", run_dir, ": ", ec.message());
  }

  void write_status(const std::string& status, int exit_code, const std::string& message) {
    if (run_dir.empty()) return;
    try {
      std::string s = "{\"status\":" + json_quote(status) +
                      ",\"exit_code\":" + (status == "RUNNING" ? std::string("null") : std::to_string(exit_code)) +
                      ",\"global_step\":" + std::to_string(st.global_step) + ",\"epoch\":" + std::to_string(st.epoch) +
                      ",\"message\":" + json_quote(message) + ",\"last_checkpoint\":" + json_quote(last_checkpoint) +
                      ",\"time\":" + json_number(wall_time_s()) + "}\n";
      write_atomic(fs::path(run_dir) / "status.json", s);
    } catch (const std::exception& e) {
      log->error("cannot write run status: {}", e.what());
    }
  }

  void setup_plugins() {
    bus = std::make_unique<EventBus>(log);
    for (const auto& p : opts.plugins) {
      const std::string sec = "plugins." + p->name();
      std::optional<int> priority;
      std::optional<FailurePolicy> policy;
      if (cfg.has(sec + ".priority")) priority = static_cast<int>(cfg.get<std::int64_t>(sec + ".priority"));
      if (cfg.has(sec + ".policy")) {
        policy =
            cfg.get<std::string>(sec + ".policy") == "essential" ? FailurePolicy::Essential : FailurePolicy::Observer;
      }
      p->configure(cfg.sub(sec), log);
      bus->add(p, priority, policy);
    }
  }

  void setup_metrics() {
    metrics = std::make_unique<MetricsLogger>(log);
    if (cfg.get<bool>("metrics.jsonl")) metrics->add_sink(std::make_shared<JsonlSink>(run_dir + "/metrics.jsonl"));
    if (cfg.get<bool>("metrics.console")) metrics->add_sink(std::make_shared<ConsoleSink>(log));
  }

  void setup_runtime() {
    const auto threads = cfg.get<std::int64_t>("runtime.num_threads");
    const int n =
        threads > 0 ? static_cast<int>(threads) : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    at::set_num_threads(n);
    if (cfg.get<bool>("runtime.tune_malloc") && !tune_cpu_allocator()) {
      log->warn("runtime.tune_malloc: the C library refused the malloc settings; running untuned");
    }
    torch::manual_seed(static_cast<std::uint64_t>(seed));
    log->info("threads: {}, seed: {}, LibTorch {}", n, seed, TORCH_VERSION);
    check_blas(*log);
  }

  void select_device() {
    const std::string requested = cfg.get<std::string>("runtime.device");
    ctx.device = c10::Device(requested == "cuda" ? std::string("cuda:0") : requested);
    const Control c = fire(Event::SelectDevice);
    if (c.switch_device) ctx.device = c10::Device(*c.switch_device);
    device = ctx.device;
    if (device.is_cuda()) {
      check_cuda_device(device, "device");
    }
    const double limit_mb = cfg.get<double>("memory.limit_mb");
    const double fraction = cfg.get<double>("memory.fraction");
    TRAINER_CHECK_T(UsageError, limit_mb == 0 || fraction == 0,
                    "memory.limit_mb and memory.fraction are both set; set one of them");
    if (has_memory_backend(device)) {
      previous_limit_ = memory_stats(device).limit;
      budget_device_ = device;
      if (fraction > 0) {
        set_memory_fraction(device, fraction);
      } else {
        set_memory_limit(device, static_cast<std::int64_t>(limit_mb * 1024.0 * 1024.0));
      }
      if (const std::int64_t limit = memory_stats(device).limit; limit > 0)
        log->info("memory budget: {} on {}", format_bytes(limit), device.str());
    } else {
      TRAINER_CHECK_T(UsageError, limit_mb == 0 && fraction == 0, "memory.limit_mb/memory.fraction on ", device.str(),
                      " need its memory backend, which this build does not have");
    }
    log->info("device: {}", device.str());
  }

  void build() {
    const Config ds = cfg.sub("dataset");
    auto factory = dataset_registry().get(cfg.get<std::string>("dataset.name")).factory;
    train_set = factory(ds, Split::Train);
    if (eval_every > 0) test_set = factory(ds, Split::Test);
    const DataSpec spec = train_set->spec();
    log->info("dataset {}: {} train, {} test samples", cfg.get<std::string>("dataset.name"), train_set->size(),
              test_set ? test_set->size() : 0);

    model = build_model(cfg.sub("model"), spec);
    input_dtype_ = model_dtype(cfg.get<std::string>("model.dtype"));
    ctx.model = model;
    fire(Event::ModelCreated);
    TRAINER_CHECK(ctx.model != nullptr, "a plugin cleared the model in ModelCreated");
    model = ctx.model;
    model->to(device);
    model->train();
    fire(Event::ModelToDevice);
    std::int64_t nparams = 0;
    for (const auto& p : model->parameters()) nparams += p.numel();
    log->info("model {}: {} parameters", cfg.get<std::string>("model.name"), nparams);

    std::vector<at::Tensor> params;
    for (const auto& p : model->parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    optim = optimizer_registry().get(cfg.get<std::string>("optim.name")).factory(cfg.sub("optim"), params);
    ctx.optimizer = optim.get();
    step_reserve_ = step_reserve_bytes();
    fire(Event::OptimizerCreated);

    st.batch_size = batch_size;
    st.micro_batch_size = micro_batch_size;
    st.num_epochs = epochs;
    const std::int64_t n = train_set->size();
    st.steps_per_epoch = drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
    TRAINER_CHECK_T(UsageError, st.steps_per_epoch > 0, "training.batch_size = ", batch_size,
                    " with drop_last leaves no batch of ", n, " samples");
    st.total_steps = st.steps_per_epoch * epochs;
    if (max_steps > 0) st.total_steps = std::min(st.total_steps, max_steps);
    schedule = schedule_registry()
                   .get(cfg.get<std::string>("sched.name"))
                   .factory(cfg.sub("sched"), get_learning_rate(*optim), st.total_steps);
  }

  // --- checkpoints -------------------------------------------------------------------
  /// Writes a checkpoint; an OOM while serialising is retried once after freeing cached
  /// memory, then reported (the run goes on without that checkpoint).
  std::string save_checkpoint(std::int64_t epoch, std::int64_t batch_in_epoch) {
    for (int attempt = 0;; ++attempt) {
      try {
        return write_checkpoint(epoch, batch_in_epoch);
      } catch (const std::exception& e) {
        if (!is_out_of_memory(e)) throw;
        report_oom(e, "checkpoint", 0, 0, attempt, /*force_clear=*/true);
        if (attempt >= 1) {
          log->error("checkpoint skipped: out of memory while writing it twice: {}", error_text(e));
          return last_checkpoint;
        }
        log->warn("out of memory while writing a checkpoint; retrying once after freeing memory");
      }
    }
  }

  std::string write_checkpoint(std::int64_t epoch, std::int64_t batch_in_epoch) {
    ExcludeFromThroughput pause{window_excluded_s};
    phase_ = "checkpoint";
    torch::serialize::OutputArchive ar, m, o;
    model->save(m);
    optim->save(o);
    ar.write("model", m);
    ar.write("optimizer", o);
    ar.write("epoch", at::tensor(epoch));
    ar.write("batch_in_epoch", at::tensor(batch_in_epoch));
    ar.write("global_step", at::tensor(st.global_step));
    ar.write("samples_seen", at::tensor(st.samples_seen));
    ar.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state());
    const fs::path dir = fs::path(run_dir) / "checkpoints";
    char name[64];
    std::snprintf(name, sizeof name, "step_%08lld.pt", static_cast<long long>(st.global_step));
    const fs::path final_path = dir / name;
    const fs::path tmp = final_path.string() + ".tmp";
    ar.save_to(tmp.string());
    fs::rename(tmp, final_path);
    write_atomic(dir / "latest", std::string(name) + "\n");
    if (std::find(checkpoints.begin(), checkpoints.end(), final_path.string()) == checkpoints.end()) {
      checkpoints.push_back(final_path.string());
    }
    while (static_cast<std::int64_t>(checkpoints.size()) > keep_last) {
      std::error_code ec;
      fs::remove(checkpoints.front(), ec);
      checkpoints.erase(checkpoints.begin());
    }
    last_checkpoint = final_path.string();
    checkpoint_step_ = st.global_step;
    log->info("checkpoint written: {}", last_checkpoint);
    ctx.checkpoint_path = last_checkpoint;
    fire(Event::Checkpoint);
    return last_checkpoint;
  }

  static std::string resolve_checkpoint(const std::string& path) {
    fs::path p(path);
    if (fs::is_directory(p)) {
      fs::path dir = fs::exists(p / "checkpoints" / "latest") ? p / "checkpoints" : p;
      std::ifstream in(dir / "latest");
      std::string name;
      TRAINER_CHECK_T(UsageError, in && std::getline(in, name) && !name.empty(), "--resume ", path,
                      ": no checkpoints/latest in that directory");
      p = dir / name;
    }
    TRAINER_CHECK_T(UsageError, fs::is_regular_file(p), "--resume: checkpoint ", p.string(), " not found");
    return p.string();
  }

  void load_checkpoint(const std::string& path) {
    const std::string file = resolve_checkpoint(path);
    torch::serialize::InputArchive ar, m, o;
    try {
      ar.load_from(file, device);
      ar.read("model", m);
      ar.read("optimizer", o);
      model->load(m);
      optim->load(o);
      start_epoch = scalar(ar, "epoch");
      start_batch = scalar(ar, "batch_in_epoch");
      st.global_step = scalar(ar, "global_step");
      st.samples_seen = scalar(ar, "samples_seen");
      at::Tensor rng;
      ar.read("rng_cpu", rng);
      at::Generator gen = at::detail::getDefaultCPUGenerator();  // shares the default generator
      gen.set_state(rng);
    } catch (const c10::Error& e) {
      throw UsageError(detail::str("cannot resume from ", file, ": ", e.what_without_backtrace(),
                                   " (was it written by this model and optimizer?)"));
    }
    if (start_batch >= st.steps_per_epoch) {
      ++start_epoch;
      start_batch = 0;
    }
    epochs_completed = start_epoch;
    log->info("resumed from {}: epoch {}, batch {}, step {}", file, start_epoch, start_batch, st.global_step);
  }

  // --- training ----------------------------------------------------------------------
  at::Tensor epoch_order(std::int64_t epoch) const {
    const std::int64_t n = train_set->size();
    if (!shuffle) return at::arange(n, at::kLong);
    auto gen = at::detail::createCPUGenerator(static_cast<std::uint64_t>(seed) * 1000003ULL +
                                              static_cast<std::uint64_t>(epoch));
    return at::randperm(n, gen, at::TensorOptions(at::kLong));
  }

  /// The current batch is consumed: a resume continues with the next one.
  void advance_position() {
    const bool last = st.batch_in_epoch + 1 >= st.steps_per_epoch;
    position_epoch = last ? st.epoch + 1 : st.epoch;
    position_batch = last ? 0 : st.batch_in_epoch + 1;
  }

  void zero_grads() {
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) p.mutable_grad() = at::Tensor();
    }
  }

  /// One optimizer step on `indices`: the batch is split into micro-batches whose losses
  /// are scaled by their share of the batch, so the accumulated gradient is the gradient of
  /// the batch's mean loss.
  /// Thrown when an out-of-memory error cannot be recovered from (no plugin asked to retry,
  /// or the retry budget is spent); carries the summary of what was tried.
  struct OomFailure : Error {
    using Error::Error;
  };

  /// Counts the OOM, frees cached memory and fires OutOfMemory describing what failed.
  Control report_oom(const std::exception& e, std::string_view phase, std::int64_t micro, std::int64_t samples,
                     std::int64_t attempt, bool force_clear) {
    clear_memory(device, force_clear);
    ++st.oom_recoveries;
    OomInfo info;
    info.phase = std::string(phase);
    info.message = error_text(e);
    info.micro_batch_size = micro;
    info.batch_size = samples;
    info.attempt = attempt;
    info.stats = has_memory_backend(device) ? memory_stats(device) : MemoryStats{};
    info.requested_bytes = info.stats.last_failed_request;
    ctx.oom = &info;  // cleared by fire() whatever happens
    return fire(Event::OutOfMemory);
  }

  /// Drops the failed attempt, fires OutOfMemory and returns the micro-batch size a plugin
  /// asked to retry with; throws OomFailure when none did.
  std::int64_t recover_from_oom(const std::exception& e, std::string_view phase, std::int64_t micro,
                                std::int64_t samples, std::int64_t attempt, std::vector<std::int64_t>& tried) {
    zero_grads();
    tried.push_back(micro);
    const std::string message = error_text(e);
    log->warn("out of memory in {} (micro-batch {}, attempt {}): {}", phase, micro, attempt + 1, message);
    const Control c = report_oom(e, phase, micro, samples, attempt, /*force_clear=*/false);
    if ((c.switch_device || c.retry_with_micro_batch) && attempt + 1 < kMaxOomAttempts) {
      std::string where;
      if (c.switch_device) {
        const c10::Device from = device;
        move_run_to(c10::Device(*c.switch_device), c.reason);
        if (device != from) devices_tried_.push_back(from.str() + " -> " + device.str());
        where = " on " + device.str();
      }
      const std::int64_t next = std::clamp<std::int64_t>(c.retry_with_micro_batch.value_or(micro), 1, samples);
      log->warn("retrying the same {}{} with micro-batches of {} ({}){}", phase == "eval" ? "evaluation" : "batch",
                where, next, next < micro ? "smaller" : "same size or larger", c.reason.empty() ? "" : ": " + c.reason);
      return next;
    }
    std::string sizes;
    for (auto t : tried) sizes += (sizes.empty() ? "" : " -> ") + std::to_string(t);
    const std::string why =
        c.retry_with_micro_batch
            ? " (retry limit reached)"
            : " (no plugin asked for another retry; oom_backoff retries down to its min_micro_batch)";
    std::string msg = message;
    while (!msg.empty() && (msg.back() == '.' || msg.back() == '\n')) msg.pop_back();
    const std::string moves = detail::join(devices_tried_);
    throw OomFailure(detail::str(
        "out of memory in ", phase, " on ", device.str(), " after ", tried.size(), " attempt(s) with micro-batches ",
        sizes, moves.empty() ? "" : " (device fallback: " + moves + ")", why, ": ", msg, ". What to change: ",
        phase == "eval" ? "a smaller eval.batch_size"
                        : "a smaller training.micro_batch_size (gradient accumulation keeps the effective batch)",
        ", a smaller model, or a larger memory.limit_mb; mixed precision and activation checkpointing also cut "
        "activation memory (not yet available as trainer plugins)"));
  }

  /// Moves the run to `to` after an out-of-memory error (Control.switch_device in
  /// OutOfMemory): parameters and buffers in place (Module::to keeps each tensor's identity,
  /// so the optimizer's references and state keys stay valid), then the optimizer state,
  /// one tensor at a time, so nothing exists twice but the tensor being copied. Gradients
  /// are undefined at this point (the failed attempt was dropped). Fires ModelToDevice.
  void move_run_to(const c10::Device& to, const std::string& reason) {
    if (to == device) {
      log->warn("switch_device {}: the run is already there{}", to.str(), reason.empty() ? "" : " (" + reason + ")");
      return;
    }
    if (to.is_cuda()) {
      check_cuda_device(to, "switch_device");
    }
    const c10::Device from = device;
    std::int64_t param_bytes = 0;
    for (const auto& p : model->parameters()) param_bytes += static_cast<std::int64_t>(p.nbytes());
    for (const auto& b : model->buffers()) param_bytes += static_cast<std::int64_t>(b.nbytes());
    zero_grads();
    model->to(to);
    const std::int64_t state_bytes = move_optimizer_state(*optim, to);
    device = to;
    ctx.device = to;
    clear_memory(from, /*force=*/true);
    log->warn("moved the run from {} to {}: {} of parameters and buffers, {} of optimizer state{}", from.str(),
              to.str(), format_bytes(param_bytes), format_bytes(state_bytes),
              reason.empty() ? "" : " (" + reason + ")");
    fire(Event::ModelToDevice);
  }
  c10::ScalarType input_dtype_ = c10::kFloat;  ///< model.dtype: inputs are cast to it
  std::vector<std::string> devices_tried_;     ///< "cpu -> cuda:1" per device fallback

  /// Forward and backward over the micro-batches of `full`; returns the summed (already
  /// batch-normalised) loss and whether a plugin asked to skip the step.
  std::pair<double, bool> accumulate(const Batch& full, const at::Tensor& indices, std::int64_t micro) {
    const std::int64_t n = full.size();
    st.num_micro_batches = (n + micro - 1) / micro;
    bool skip = false;
    at::Tensor loss_sum;  // summed on the device, read once: no extra op for a single micro-batch
    for (std::int64_t i = 0; i < st.num_micro_batches; ++i) {
      const std::int64_t begin = i * micro, len = std::min(micro, n - begin);
      const bool whole = st.num_micro_batches == 1;
      Batch mb = whole ? full : Batch{full.inputs.narrow(0, begin, len), full.targets.narrow(0, begin, len)};
      const at::Tensor idx = whole ? indices : indices.narrow(0, begin, len);
      st.micro_batch_index = i;
      ctx.batch = &mb;
      ctx.indices = &idx;
      skip |= fire(Event::BeforeForward).skip_step;
      phase_ = "forward";
      at::Tensor out = model->forward(mb.inputs);
      at::Tensor loss = at::cross_entropy_loss(out, mb.targets);
      if (len != n) loss = loss * (static_cast<double>(len) / static_cast<double>(n));
      ctx.batch = &mb;
      ctx.indices = &idx;
      ctx.outputs = &out;
      ctx.loss = &loss;
      skip |= fire(Event::AfterForward).skip_step;
      ctx.batch = &mb;
      ctx.indices = &idx;
      ctx.loss = &loss;
      skip |= fire(Event::BeforeBackward).skip_step;
      phase_ = "backward";
      loss.backward();
      ctx.batch = &mb;
      ctx.indices = &idx;
      ctx.loss = &loss;
      skip |= fire(Event::AfterBackward).skip_step;
      loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
    }
    return {loss_sum.item<double>(), skip};
  }

  /// Bytes an optimizer step may allocate for temporaries: its parameter-sized temporaries
  /// (optimizer_step_temporaries) times the largest parameter, plus 64 KiB for scalars.
  std::int64_t step_reserve_bytes() const {
    std::int64_t largest = 0;
    for (const auto& p : model->parameters()) largest = std::max<std::int64_t>(largest, p.nbytes());
    return optimizer_step_temporaries(*optim) * largest + (64 << 10);
  }
  std::int64_t step_reserve_ = 0;  ///< step_reserve_bytes(), computed once the optimizer exists

  /// The optimizer step, made atomic against OOM: state is materialised up front and the
  /// step's temporaries are reserved (allocated and freed) before anything is modified, so
  /// an OOM leaves parameters and optimizer state exactly as they were.
  void atomic_step() {
    phase_ = "optimizer_step";
    if (!state_materialized_) state_materialized_ = materialize_optimizer_state(*optim);
    { at::Tensor reserve = at::empty({step_reserve_}, at::TensorOptions(at::kByte).device(device)); }
    in_step_ = true;
    optim->step();
    in_step_ = false;
  }

  /// One optimizer step on `indices`: the batch is split into micro-batches whose losses
  /// are scaled by their share of the batch, so the accumulated gradient is the gradient of
  /// the batch's mean loss. An out-of-memory error anywhere in it drops the attempt and,
  /// when a plugin asks (OutOfMemory), re-runs the same samples in smaller micro-batches.
  bool train_batch(const at::Tensor& indices) {
    const std::int64_t n = indices.size(0);
    // BatchStart reports the micro-batch setting; attempts report the size they really use
    // (capped at the batch, which is shorter at the end of an epoch).
    st.micro_batch_size = micro_batch_size;
    st.num_micro_batches = (n + micro_batch_size - 1) / micro_batch_size;
    st.micro_batch_index = 0;
    if (fire(Event::BatchStart).skip_step) {
      log->debug("batch {} skipped at BatchStart", st.batch_in_epoch);
      advance_position();
      return false;
    }
    std::int64_t micro = std::min(micro_batch_size, n);  // BatchStart may have changed it
    std::vector<std::int64_t> tried;
    for (std::int64_t attempt = 0;; ++attempt) {
      st.micro_batch_size = micro;
      try {
        phase_ = "data";
        Batch full = train_set->get(indices);
        if (device != full.inputs.device() || full.inputs.scalar_type() != input_dtype_)
          full = {full.inputs.to(device, input_dtype_), full.targets.to(device)};
        zero_grads();
        auto [batch_loss, skip] = accumulate(full, indices, micro);
        st.loss = batch_loss;
        st.lr = schedule->lr_at(st.global_step);
        if (!skip) {
          phase_ = "optimizer_step";
          if (clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), clip);
          set_learning_rate(*optim, st.lr);
          skip = fire(Event::BeforeOptimizerStep).skip_step;
        }
        if (skip) {
          zero_grads();
          log->debug("optimizer step skipped at batch {}", st.batch_in_epoch);
          advance_position();
          return false;
        }
        atomic_step();
        window_loss += batch_loss;
        break;
      } catch (const std::exception& e) {
        if (!is_out_of_memory(e)) throw;
        if (in_step_) {
          // The reserve was not enough: the step ran out of memory half-way. Parameters may
          // be partly updated, so neither a retry nor a checkpoint of them is safe.
          in_step_ = false;
          params_consistent_ = false;
          throw Error(detail::str("out of memory inside the optimizer step after its reserve (",
                                  format_bytes(step_reserve_),
                                  "); parameters may be partly updated, so the run "
                                  "stops without a final checkpoint: ",
                                  error_text(e)));
        }
        micro = recover_from_oom(e, phase_, micro, n, attempt, tried);
        micro_batch_size = micro;  // later batches keep the size that worked (oom_backoff grows it back)
      }
    }
    ++st.global_step;
    st.samples_seen += n;
    advance_position();
    fire(Event::AfterOptimizerStep);
    ++window_steps;
    window_samples += n;
    return true;
  }

  void log_train_metrics() {
    if (window_steps == 0) return;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count() - window_excluded_s;
    metrics->log(st.global_step,
                 {{"train/loss", window_loss / double(window_steps)},
                  {"train/lr", st.lr},
                  {"train/epoch", double(st.epoch) + double(st.batch_in_epoch + 1) / double(st.steps_per_epoch)},
                  {"train/samples_per_s", secs > 0 ? double(window_samples) / secs : 0.0}});
    window_loss = 0;
    window_steps = 0;
    window_samples = 0;
    window_excluded_s = 0.0;
    window_start = std::chrono::steady_clock::now();
  }

  /// Adds the time until the guard dies to window_excluded_s (throughput is training only).
  struct ExcludeFromThroughput {
    double& excluded;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~ExcludeFromThroughput() {
      excluded += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  };

  std::map<std::string, double> evaluate() {
    std::map<std::string, double> m;
    if (!test_set) return m;
    ExcludeFromThroughput pause{window_excluded_s};
    fire(Event::EvalStart);
    const std::int64_t n = test_set->size();
    double loss_sum = 0.0;
    std::int64_t correct = 0;
    std::vector<std::int64_t> tried;
    std::int64_t batch = eval_batch;
    model->eval();
    for (std::int64_t attempt = 0;; ++attempt) {
      // Every attempt starts from zero: a retried evaluation counts each sample once.
      loss_sum = 0.0;
      correct = 0;
      try {
        phase_ = "eval";
        at::NoGradGuard no_grad;
        for (std::int64_t begin = 0; begin < n; begin += batch) {
          const std::int64_t len = std::min(batch, n - begin);
          Batch b = test_set->get(at::arange(begin, begin + len, at::kLong));
          at::Tensor x = b.inputs.to(device, input_dtype_), y = b.targets.to(device);
          at::Tensor out = model->forward(x);
          loss_sum += at::cross_entropy_loss(out, y, {}, at::Reduction::Sum).item<double>();
          correct += out.argmax(1).eq(y).sum().item<std::int64_t>();
        }
        break;
      } catch (const std::exception& e) {
        if (!is_out_of_memory(e)) {
          model->train();
          throw;
        }
        try {
          batch = recover_from_oom(e, "eval", batch, n, attempt, tried);
        } catch (...) {
          model->train();
          throw;
        }
        eval_batch = batch;  // later evaluations keep the size that worked
      }
    }
    model->train();
    m["eval/loss"] = loss_sum / double(n);
    m["eval/accuracy"] = double(correct) / double(n);
    metrics->log(st.global_step, m);
    ctx.eval_metrics = &m;
    fire(Event::EvalEnd);
    return m;
  }

  void check_stop() {
    if (interrupt_requested()) throw StopRun{};
    if (want_stop) throw StopRun{};
    if (max_steps > 0 && st.global_step >= max_steps) {
      stop_reason = "training.max_steps reached";
      throw StopRun{};
    }
  }

  bool stop_requested() const {
    return interrupt_requested() || want_stop || (max_steps > 0 && st.global_step >= max_steps);
  }

  void run_loop() {
    window_start = std::chrono::steady_clock::now();
    for (std::int64_t epoch = start_epoch; epoch < epochs; ++epoch) {
      st.epoch = epoch;
      st.batch_in_epoch = start_batch;
      fire(Event::EpochStart);
      const at::Tensor order = epoch_order(epoch);
      const std::int64_t n = order.size(0);
      for (std::int64_t b = start_batch; b < st.steps_per_epoch; ++b) {
        st.batch_in_epoch = b;
        const std::int64_t begin = b * batch_size, len = std::min(batch_size, n - begin);
        const bool stepped = train_batch(order.narrow(0, begin, len));
        fire(Event::BatchEnd);
        if (stepped && st.global_step % log_every == 0) log_train_metrics();
        if (want_eval) {
          want_eval = false;
          evaluate();
        }
        const bool step_ckpt = stepped && ckpt_every_steps > 0 && st.global_step % ckpt_every_steps == 0;
        if (want_checkpoint || step_ckpt) {
          want_checkpoint = false;
          save_checkpoint(position_epoch, position_batch);
        }
        // A stop on the last batch of an epoch still finishes the epoch (eval, EpochEnd).
        if (stop_requested() && b + 1 < st.steps_per_epoch) check_stop();
      }
      start_batch = 0;
      log_train_metrics();
      if (eval_every > 0 && (epoch + 1) % eval_every == 0) evaluate();
      epochs_completed = epoch + 1;
      fire(Event::EpochEnd);
      if (ckpt_every_epochs > 0 && (epoch + 1) % ckpt_every_epochs == 0) save_checkpoint(epoch + 1, 0);
      check_stop();
    }
  }

  std::int64_t position_epoch = 0, position_batch = 0;

  void final_checkpoint() {
    if (!ckpt_at_end || !fit_started) return;
    if (!params_consistent_) {
      log->error("no final checkpoint: parameters may be inconsistent after an OOM inside the optimizer step");
      return;
    }
    if (!last_checkpoint.empty() && checkpoint_step_ == st.global_step) return;
    try {
      save_checkpoint(position_epoch, position_batch);
    } catch (const std::exception& e) {
      log->error("final checkpoint failed: {}", e.what());
    }
  }
  std::int64_t checkpoint_step_ = -1;
  static constexpr std::int64_t kMaxOomAttempts = 64;  ///< per batch, whatever plugins ask
  const char* phase_ = "setup";                        ///< what the loop is doing, for OOM reports
  bool state_materialized_ = false;                    ///< optimizer state created before the first step
  bool in_step_ = false;                               ///< inside optim->step() (past the reserve)
  std::int64_t previous_limit_ = 0;                    ///< the device budget before this run set its own
  std::optional<c10::Device> budget_device_;           ///< where this run set a budget
  bool params_consistent_ = true;                      ///< false after an OOM inside the step proper
  bool fit_started = false;                            ///< model, optimizer and resume state are in place

  RunResult fit() {
    RunResult r;
    detail::SignalScope signals(opts.handle_signals);
    log = default_logger();
    install_cpu_tracking_allocator();  // counts from the start; the budget comes with the device
    std::exception_ptr failure;
    bool interrupted = false;
    try {
      read_settings();
      make_run_dir();
      log = configure_logging(run_dir, opts.log_level);
      write_atomic(fs::path(run_dir) / "config.toml", cfg.to_toml());
      write_status("RUNNING", 0, "");
      setup_metrics();
      ctx.config = &cfg;
      ctx.logger = log;
      ctx.metrics = metrics.get();
      ctx.run_dir = run_dir;
      setup_plugins();
      log->info("run directory: {}", run_dir);
      fire(Event::Init);
      setup_runtime();
      select_device();
      build();
      if (!opts.resume.empty()) load_checkpoint(opts.resume);
      position_epoch = start_epoch;
      position_batch = start_batch;
      st.epoch = start_epoch;
      st.batch_in_epoch = start_batch;
      fit_started = true;
      fire(Event::FitStart);
      try {
        run_loop();
      } catch (const StopRun&) {
        interrupted = interrupt_requested();
        if (interrupted) stop_reason = "interrupted by a signal";
        log->info("stopping: {}", stop_reason);
      }
      r.status = interrupted ? "KILLED" : "FINISHED";
      r.exit_code = interrupted ? kExitInterrupted : kExitOk;
      r.message = interrupted ? stop_reason : "";
      final_checkpoint();
      ctx.status = r.status;
      fire(Event::FitEnd);
    } catch (...) {
      failure = std::current_exception();
    }
    if (failure) {
      r.status = "FAILED";
      r.exit_code = kExitTrainingFailed;
      try {
        std::rethrow_exception(failure);
      } catch (const ExitRequest& e) {
        r.exit_code = e.exit_code();
        r.status = e.status();
        r.message = e.what();
      } catch (const UsageError& e) {
        r.exit_code = kExitUsage;
        r.message = e.what();
      } catch (const c10::Error& e) {
        r.message = e.what_without_backtrace();
      } catch (const std::exception& e) {
        r.message = e.what();
      } catch (...) {
        r.message = "unknown exception";
      }
      log->error("run failed: {}", r.message);
      final_checkpoint();
      if (bus) {
        ctx.exception = failure;
        ctx.status = r.status;
        try {
          fire(Event::Exception);
        } catch (const std::exception& e) {
          log->error("while handling the failure: {}", e.what());
        }
      }
    }
    if (bus) {
      ctx.status = r.status;
      try {
        fire(Event::Shutdown);
      } catch (const std::exception& e) {
        log->error("Shutdown: {}", e.what());
      }
    }
    // The budget is the run's: the process gets its previous limit back.
    if (budget_device_) set_memory_limit(*budget_device_, previous_limit_);
    if (metrics) metrics->close(r.status);
    write_status(r.status, r.exit_code, r.message);
    r.run_dir = run_dir;
    r.global_step = st.global_step;
    r.epochs_completed = epochs_completed;
    r.final_metrics = metrics ? metrics->latest() : std::map<std::string, double>{};
    r.last_checkpoint = last_checkpoint;
    log->info("run {}: {} steps, status {}", run_dir, st.global_step, r.status);
    log->flush();
    return r;
  }
};

Trainer::Trainer(TrainerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Trainer::~Trainer() = default;
RunResult Trainer::fit() { return impl_->fit(); }
std::shared_ptr<Model> Trainer::model() const { return impl_->model; }

}  // namespace trainer
