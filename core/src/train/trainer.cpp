// Trainer::fit(): a run as a list of named stages, and how a failure becomes an exit code.
// The rooms of the loop, one file each in this directory:
//   setup        runtime, device and memory budget, data, model, optimizer, the plan
//   hooks        firing events with their arguments; Control applied by events.h's table
//   loop         epochs, batches and the safe points (evaluation, checkpoints, stops)
//   step         one batch: micro-batches, gradient accumulation, the atomic optimizer step
//   oom_recovery out-of-memory errors: report, ask the plugins, back off, device fallback
//   evaluate     evaluation on the test split
//   checkpoint   save, prune, the final checkpoint, resume (checkpoint_files: the files on disk)
//   run_dir      the run directory, config.toml, status.json (durable writes: util/durable_file)
#include "trainer/trainer.h"

#include <c10/util/Exception.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/optim/optimizer.h>

#include <unistd.h>

#include <optional>

#include <spdlog/sinks/sink.h>

#include <chrono>
#include <filesystem>

#include "dist/dist_settings.h"
#include "train/checkpoint.h"
#include "train/checkpoint_files.h"
#include "train/evaluate.h"
#include "train/hooks.h"
#include "train/loop.h"
#include "train/oom_recovery.h"
#include "train/run_dir.h"
#include "train/setup.h"
#include "train/signal_scope.h"
#include "train/step.h"
#include "train/train_metrics.h"
#include "trainer/distributed.h"
#include "trainer/exit_status.h"
#include "trainer/interrupt.h"
#include "trainer/loader.h"
#include "trainer/logging.h"
#include "trainer/memory.h"
#include "trainer/secrets.h"
#include "util/log_file_sink.h"

namespace fs = std::filesystem;

namespace trainer {

namespace {

/// The loop's rooms, built once set-up is done (they act on the model and the optimizer).
struct Rooms {
  Rooms(const LoopSettings& s, const std::string& checkpoint_dir, DataOrder order, std::string config, RunParts& parts,
        RunState& state, Hooks& hooks, MetricsLogger& metrics, spdlog::logger& log)
      : window(metrics, parts.task),
        oom(parts, state, hooks, log),
        step(s.training, parts, state, hooks, oom, window, log),
        evaluator(s.eval, parts, state, hooks, oom, metrics, window),
        checkpointer(s.checkpoint, checkpoint_dir, std::move(order), std::move(config), parts, state, hooks, oom,
                     window, evaluator, log),
        loop(s, parts, state, hooks, step, evaluator, checkpointer, window) {}

  TrainMetrics window;
  OomRecovery oom;
  TrainStep step;
  Evaluator evaluator;
  Checkpointer checkpointer;
  EpochLoop loop;
};

}  // namespace

struct Trainer::Impl {
  explicit Impl(TrainerOptions o) : opts(std::move(o)), cfg(opts.config) {}

  TrainerOptions opts;
  const Config& cfg;
  std::shared_ptr<spdlog::logger> log;
  LoopSettings settings;
  RunState state;
  std::string attempted_dir;  ///< the run directory, also when it could not be created
  bool named_here = false;    ///< the run named its directory itself and created it
  std::optional<RunDir> dir;
  std::unique_ptr<MetricsLogger> metrics;
  std::unique_ptr<Hooks> hooks;
  RunParts parts;
  std::optional<MemoryBudget> budget;
  std::unique_ptr<Rooms> rooms;
  bool fit_started = false;      ///< model, optimizer and resume state are in place
  std::int64_t first_step = -1;  ///< the step this process's training started at (FitStart)
  bool fitted = false;           ///< fit() was called: a Trainer runs once
  bool autoresumed = false;      ///< checkpoint.autoresume found checkpoints in the run directory
  bool in_place = false;         ///< resuming from a checkpoint of the run directory itself
  bool claimed = false;          ///< config.toml and status.json are this run's (claim_run_dir)

  RunResult fit() {
    if (fitted) {
      RunResult r;
      r.status = RunStatus::Failed;
      r.failure = FailureKind::Usage;
      r.exit_code = kExitUsage;
      r.message = "Trainer::fit() was already called; a Trainer runs once (construct another for the next run)";
      return r;
    }
    fitted = true;
    clear_interrupt();  // a request left by an earlier run in this process is not this run's
    detail::SignalScope signals(opts.handle_signals);
    log = default_logger();
    install_cpu_tracking_allocator();  // counts from the start; the budget comes with the device
    RunResult r;
    try {
      start_run();
      set_up();
      resume();
      r = train();
    } catch (...) {
      r = failed(std::current_exception());
    }
    shut_down(r);
    return r;
  }

  /// The process group of a data-parallel launch; the run directory, its log, config.toml and
  /// status.json, the metric sinks, the plugins; then Init.
  void start_run() {
    settings = {TrainingSettings::from(cfg.sub("training")), EvalSettings::from(cfg.sub("eval")),
                CheckpointSettings::from(cfg.sub("checkpoint")), RunSettings::from(cfg.sub("run")).seed};
    join_group();
    choose_resume();
    attempted_dir = RunDir::path_for(RunSettings::from(cfg.sub("run")), opts.run_dir, /*claim=*/parts.writer());
    // One run, one directory: rank 0's (its name has the time in it).
    if (parts.group) attempted_dir = parts.group->share("run_dir", attempted_dir);
    named_here = opts.run_dir.empty();
    dir.emplace(attempted_dir);
    std::error_code ec;
    in_place = !opts.resume.empty() && fs::equivalent(run_dir_of_resume(opts.resume), dir->path(), ec);
    log = configure_logging(parts.writer() ? dir->path() : std::string(), opts.log_level);
    if (parts.group) log_as_rank(*log, dir->path(), parts.group->rank());
    // Resuming in place, the run's config.toml and status.json stay as they are until its
    // checkpoint has loaded: a resume that is refused leaves the run as it was.
    if (!in_place) claim_run_dir();
    auto metric_settings = MetricsSettings::from(cfg.sub("metrics"));
    if (!parts.writer()) metric_settings.jsonl = metric_settings.console = false;  // rank 0 reports the run
    metrics = make_metrics(metric_settings, dir->path(), log);
    hooks = std::make_unique<Hooks>(cfg, log, *metrics, dir->path(), state);
    hooks->context().group = parts.group.get();
    hooks->start_memory_timeline(MemorySettings::from(cfg.sub("memory")), parts.group ? parts.group->rank() : 0);
    hooks->add_plugins(opts.plugins);
    log->info("run directory: {}{}", dir->path(), in_place ? " (resuming in place)" : "");
    if (autoresumed) log->info("checkpoint.autoresume: {} holds checkpoints; resuming from them", dir->path());
    for (const auto& note : opts.notes) log->warn("{}", note);
    hooks->fire(Event::Init);
  }

  /// Where the run resumes from and in which directory: a run given only `resume` continues in
  /// the run directory that holds it; with checkpoint.autoresume a run directory given that
  /// holds checkpoints is resumed (rank 0 looks; every rank follows).
  void choose_resume() {
    if (!opts.resume.empty()) {
      if (opts.run_dir.empty()) opts.run_dir = run_dir_of_resume(opts.resume);
      return;
    }
    if (!settings.checkpoint.autoresume) return;
    TRAINER_CHECK_T(UsageError, !opts.run_dir.empty(),
                    "checkpoint.autoresume = true needs the run directory named (--run-dir DIR, the same at every "
                    "start): a newly named one has nothing to resume");
    bool found = holds_checkpoints(opts.run_dir);
    if (parts.group) found = parts.group->share("autoresume", found ? "1" : "0") == "1";
    if (!found) return;
    opts.resume = opts.run_dir;
    autoresumed = true;
  }

  /// A data-parallel launch (torchrun's variables): joins the other ranks before anything else,
  /// so that they agree on everything that follows.
  void join_group() {
    const DistEnv env = DistEnv::from_env();
    if (!env.active()) return;
    const auto s = DistributedSettings::from(cfg.sub("distributed"));
    parts.group =
        std::make_shared<ProcessGroup>(env, std::chrono::milliseconds(static_cast<std::int64_t>(s.timeout_s * 1000.0)));
    parts.bucket_bytes = std::max<std::int64_t>(1, static_cast<std::int64_t>(s.bucket_mb * (1 << 20)));
    parts.overlap = s.overlap;
  }

  /// Every line says which rank wrote it; ranks other than 0 keep their own log in the run
  /// directory (rank-N.log) and show only warnings and errors on the console.
  static void log_as_rank(spdlog::logger& log, const std::string& dir, std::int64_t rank) {
    const std::string tag = "[rank " + std::to_string(rank) + "] ";
    auto& sinks = log.sinks();
    if (rank != 0) {
      sinks.front()->set_level(spdlog::level::warn);
      sinks.push_back(detail::log_file_sink(dir + "/rank-" + std::to_string(rank) + ".log"));
    }
    sinks.front()->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ " + tag + "%v");
    for (std::size_t i = 1; i < sinks.size(); ++i) sinks[i]->set_pattern("%Y-%m-%d %H:%M:%S.%e %-5l " + tag + "%v");
  }

  /// Runtime, device and memory budget, data, model, optimizer, the plan of steps; then the
  /// rooms of the loop.
  void set_up() {
    const auto runtime = RuntimeSettings::from(cfg.sub("runtime"));
    // Ranks on one host share its cores.
    const DistEnv env = DistEnv::from_env();
    setup_runtime(parts, runtime, settings.seed, env.active() ? static_cast<int>(env.local_world_size) : 1, *log);
    parts.device = select_device(*hooks, runtime);
    if (parts.group) check_one_gpu_per_rank();
    budget.emplace(parts.device, MemorySettings::from(cfg.sub("memory")), *log);
    log->info("device: {}", parts.device.str());
    setup_data(parts, cfg, settings.eval.evaluates(), *log);
    setup_model(parts, *hooks, cfg, /*resuming=*/!opts.resume.empty(), *log);
    setup_optimizer(parts, *hooks, cfg);
    if (parts.group) {
      // Every rank starts from rank 0's weights (a resume then loads the same checkpoint on each).
      broadcast_module_state(*parts.group, *parts.model);
      log->info("data-parallel: rank {} of {}, global batch {} ({} per rank)", parts.group->rank(), parts.group->size(),
                settings.training.batch_size, settings.training.batch_size / parts.group->size());
    }
    plan_steps(parts, state, settings.training, settings.seed, cfg, *log);
    const auto loader = LoaderSettings::from(cfg.sub("loader"));
    parts.loader = std::make_shared<BatchLoader>(parts.train_set, loader.workers, loader.prefetch);
    rooms = std::make_unique<Rooms>(settings, dir->checkpoints(),
                                    data_order_of(cfg, parts.train_set->size(), parts.train_set->lengths()),
                                    redacted(cfg).to_toml(), parts, state, *hooks, *metrics, *log);
  }

  /// Two ranks on one GPU would share its memory and, with NCCL, fail: each rank of a host
  /// takes its own (plain "cuda" is cuda:<LOCAL_RANK>; device_select's leases are exclusive).
  void check_one_gpu_per_rank() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const auto places = parts.group->gather("device", std::string(host) + " " + physical_gpu(parts.device));
    const std::string shared = shared_gpu(places);
    TRAINER_CHECK_T(UsageError, shared.empty(), "data-parallel: ", shared,
                    "; give each rank of a host its own GPU: runtime.device = \"cuda\" (cuda:<LOCAL_RANK>), or "
                    "device_select with device = \"auto\" (exclusive leases) or \"cuda\"");
  }

  /// --resume: model, optimizer, counters, RNG and plugin states from the checkpoint; the loop
  /// starts at its position; Resume.
  void resume() {
    if (opts.resume.empty()) {
      rooms->loop.start_at(Position{});
      return;
    }
    ResumeInfo info;
    if (parts.group && parts.group->rank() != 0) {
      // Rank 0 picks the checkpoint (the newest complete one of a directory); every rank loads
      // that file, also where a rank would see another newest one.
      rooms->loop.start_at(rooms->checkpointer.load(parts.group->share("resume", ""), info));
    } else {
      rooms->loop.start_at(rooms->checkpointer.load(opts.resume, info));
      if (parts.group) parts.group->share("resume", info.checkpoint);
    }
    hooks->context().checkpoint_path = info.checkpoint;
    if (in_place) claim_run_dir();
    log_config_changes(rooms->checkpointer.loaded_config());
    // metrics.jsonl marks where the run resumed (a run resumed in place appends to it).
    metrics->log(state.global_step, {{"resume/step", static_cast<double>(state.global_step)}});
    metrics->commit();
    hooks->fire(Event::Resume, EventArgs::resumed(info));
  }

  /// The keys whose values differ from those the checkpoint was written with (overrides of a
  /// resume), logged once.
  void log_config_changes(const std::string& then_text) {
    if (then_text.empty()) return;
    std::vector<std::string> changed;
    try {
      // The checkpoint's config has no secrets: neither has what it is compared with (logged).
      const Config written = redacted(cfg);
      const Config then = Config::parse(then_text, "the checkpoint's config");
      for (const auto& key : written.leaf_keys()) {
        const std::string now = config_value_to_toml(written.value(key));
        const std::string was = then.has(key) ? config_value_to_toml(then.value(key)) : "(not set)";
        if (now != was) changed.push_back(key + " " + was + " -> " + now);
      }
      for (const auto& key : then.leaf_keys()) {
        if (!written.has(key)) changed.push_back(key + " " + config_value_to_toml(then.value(key)) + " -> (not set)");
      }
    } catch (const std::exception& e) {
      log->warn("the checkpoint's config cannot be read ({}): its changes are not listed", e.what());
      return;
    }
    if (!changed.empty()) log->info("resumed with config changes: {}", fmt::join(changed, "; "));
  }

  /// FitStart, the epochs, the final checkpoint, FitEnd.
  RunResult train() {
    fit_started = true;
    first_step = state.global_step;
    hooks->fire(Event::FitStart);
    const std::optional<StopCause> stopped = rooms->loop.run();
    // A signal on any rank of a data-parallel run interrupts every rank (they agree on it).
    const bool interrupted = stopped && (interrupt_requested() || stopped->kind == StopKind::Signal);
    RunResult r;
    r.status = interrupted ? RunStatus::Killed : RunStatus::Finished;
    r.exit_code = interrupted ? kExitInterrupted : kExitOk;
    if (stopped) {
      r.message = interrupted ? "interrupted by a signal" : "";
      r.stopped_by = stopped->by;
      r.stop_reason = stopped->reason;
      log->info("stopping: {}",
                stopped->kind == StopKind::Signal ? stopped->reason : stopped->by + ": " + stopped->reason);
    }
    if (!(interrupted && nothing_trained())) final_checkpoint(true);
    hooks->context().status = r.status;
    hooks->fire(Event::FitEnd);
    return r;
  }

  /// What an exception that escaped the run means for its outcome: status, exit code,
  /// message. Then the final checkpoint and Exception.
  RunResult failed(const std::exception_ptr& failure) {
    RunResult r;
    r.status = RunStatus::Failed;
    r.failure = FailureKind::Error;
    r.exit_code = kExitTrainingFailed;
    const auto outcome = [&r](const std::exception& e) {
      const ExitStatus x = exit_status_of(e, /*during_run=*/true);
      r.exit_code = x.exit_code;
      r.status = x.status;
      r.failure = x.failure;
    };
    try {
      std::rethrow_exception(failure);
    } catch (const OomFailure& e) {
      outcome(e);
      r.oom_phase = e.phase;  // none outside the loop (loading a checkpoint)
      r.oom_micro_batch = e.micro_batch;
      r.message = e.what();
    } catch (const c10::Error& e) {
      outcome(e);
      r.message = e.what_without_backtrace();
    } catch (const std::exception& e) {
      outcome(e);
      r.message = e.what();
    } catch (...) {
      r.message = "unknown exception";
    }
    if (r.status == RunStatus::Killed) {
      log->info("stopping: {}", r.message);
    } else {
      log->error("run failed: {}", r.message);
    }
    if (r.status == RunStatus::Killed && nothing_trained()) {
      // Interrupted in a phase before the first step (a dataset scan, feature caching): a
      // checkpoint would hold nothing trained (a probe's untrained head).
      if (fit_started) log->info("no final checkpoint: no step was trained since the run started");
    } else if (r.failure == FailureKind::Diverged) {
      // The weights that gave a NaN may already be ruined: the last checkpoint stays `latest`.
      const std::string last = last_checkpoint();
      log->info("no final checkpoint after divergence; {}",
                last.empty() ? "no checkpoint was written before it" : "the last one stays latest: " + last);
    } else {
      final_checkpoint(false);
    }
    if (hooks) {
      hooks->context().exception = failure;
      hooks->context().status = r.status;
      guarded("while handling the failure", [&] { hooks->fire(Event::Exception); });
    }
    return r;
  }

  /// Shutdown, the device's previous memory limit, the metric sinks closed, the final
  /// status.json; fills in what the result reports.
  void shut_down(RunResult& r) {
    if (hooks) {
      hooks->context().status = r.status;
      guarded("Shutdown", [&] { hooks->fire(Event::Shutdown); });
      // Observer failures do not change the outcome; they are summarised once, here.
      const auto failures = hooks->observer_failure_summary();
      if (!failures.empty()) {
        for (const auto& f : failures) log->warn("observer plugin failure: {}", f);
        r.message += (r.message.empty() ? "" : "; ") + std::string("observer plugin failures: ") +
                     fmt::to_string(fmt::join(failures, "; "));
      }
    }
    budget.reset();  // the budget is the run's: the process gets its previous limit back
    if (metrics) guarded("closing the metric sinks", [&] { metrics->close(run_status_name(r.status)); });
    write_status(r);
    r.run_dir = dir ? dir->path() : attempted_dir;
    r.global_step = state.global_step;
    r.epochs_completed = rooms ? rooms->loop.epochs_completed() : 0;
    r.final_metrics = metrics ? metrics->latest() : std::map<std::string, double>{};
    r.last_checkpoint = last_checkpoint();
    const std::string stop = r.stopped_by.empty() || r.stopped_by == "signal"
                                 ? std::string()
                                 : " (stopped by " + r.stopped_by + ": " + r.stop_reason + ")";
    log->info("run {}: {} steps, status {}{}", r.run_dir, state.global_step, run_status_name(r.status), stop);
    log->flush();
    // A start that failed before training leaves no directory of its own naming behind when it
    // holds only what the core wrote (the error is on the console; an explicit --run-dir stays,
    // its status.json saying why).
    const bool failed_start = r.status == RunStatus::Failed && !fit_started;
    const bool interrupted_start = r.status == RunStatus::Killed && nothing_trained();
    if ((failed_start || interrupted_start) && named_here && dir && !parts.group) {
      guarded("removing the run directory", [&] {
        if (dir->remove_if_only_core_files()) {
          log->info("run directory {} removed: the run {} before training, nothing in it to keep", r.run_dir,
                    failed_start ? "failed" : "was interrupted");
          r.run_dir.clear();
        }
      });
    }
  }

  /// Runs `f` where the run is already ending: whatever it throws is logged, never thrown
  /// (fit() returns a result, it does not throw).
  template <typename F>
  void guarded(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      log->error("{}: {}", what, e.what());
    } catch (...) {
      log->error("{}: an exception that is not a std::exception", what);
    }
  }

  /// The run's last checkpoint; `together` when every rank of a data-parallel run ends here in
  /// step (finished or stopped by agreement), not after a failure.
  void final_checkpoint(bool together) {
    if (fit_started) {
      rooms->checkpointer.save_final(rooms->step.position(), rooms->step.params_consistent(), together);
    }
  }

  /// No step was trained by this process (it stopped before or at its first step).
  bool nothing_trained() const { return !fit_started || state.global_step == first_step; }

  std::string last_checkpoint() const { return rooms ? rooms->checkpointer.last() : std::string(); }

  /// This run's config.toml and status.json (RUNNING) in its directory; from now on the
  /// status is this run's.
  void claim_run_dir() {
    if (parts.writer()) write_atomic(dir->path() + "/config.toml", run_config_toml(cfg));
    claimed = true;
    RunResult running;
    running.status = RunStatus::Running;
    write_status(running);
  }

  void write_status(const RunResult& r) {
    if (!dir || !parts.writer() || !claimed) return;
    RunStatusRecord s;
    s.status = r.status;
    s.exit_code = r.exit_code;
    s.global_step = state.global_step;
    s.epoch = state.epoch;
    s.message = r.message;
    s.last_checkpoint = last_checkpoint();
    s.stopped_by = r.stopped_by;
    s.reason = r.stop_reason;
    s.failure = r.failure;
    s.oom_phase = r.oom_phase;
    s.micro_batch = r.oom_micro_batch;
    s.checkpointed_blocks = state.checkpointed_blocks;
    if (state.optimizer_moment_bits != state.configured_moment_bits)
      s.optimizer_moment_bits = state.optimizer_moment_bits;
    s.optimizer_offload = state.optimizer_offload;
    if (rooms) {
      s.skipped_steps = rooms->step.skipped().total();
      s.skipped_in_a_row = rooms->step.skipped().in_a_row();
    }
    const std::string error = dir->write_status(s);
    if (!error.empty()) log->error("cannot write run status: {}", error);
  }
};

Trainer::Trainer(TrainerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Trainer::~Trainer() = default;
RunResult Trainer::fit() { return impl_->fit(); }
std::shared_ptr<Model> Trainer::model() const { return impl_->parts.model; }

}  // namespace trainer
