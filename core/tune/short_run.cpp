#include "short_run.h"

#include <spdlog/spdlog.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "trainer/core_settings.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/json.h"
#include "trainer/logging.h"
#include "trainer/memory.h"
#include "trainer/optim.h"
#include "trainer/plugin.h"
#include "trainer/trainer.h"

namespace trainer::tune {
namespace {

namespace fs = std::filesystem;

/// Measures the steps of the run it is added to. It runs last in dispatch order: the peak window
/// opens after the other plugins' BatchStart work (and closes, at BeforeOptimizerStep, after
/// theirs too).
class MeasurePlugin final : public Plugin {
 public:
  MeasurePlugin(ShortRunResult& out, const ShortRunSpec& spec)
      : out_(out), blocks_(spec.checkpointed_blocks), bits_(spec.moment_bits), offload_(spec.offload) {}
  std::string name() const override { return "tune_measure"; }
  std::vector<Event> events() const override {
    return {Event::FitStart,  Event::BatchStart, Event::BeforeOptimizerStep, Event::BatchEnd,
            Event::EvalStart, Event::EvalEnd,    Event::OutOfMemory};
  }
  int default_priority() const override { return 1000000; }

  void on_event(EventContext& ctx, Control& control) override {
    const bool accounted = has_memory_backend(ctx.device);
    switch (ctx.event) {
      case Event::FitStart: {
        out_.device = ctx.device.str();
        if (ctx.train_set) out_.train_samples = ctx.train_set->size();
        if (ctx.model) {
          for (const auto& p : ctx.model->parameters()) {
            out_.parameter_bytes += p.nbytes();
            if (p.requires_grad()) out_.gradient_bytes += p.nbytes();
          }
          for (const auto& b : ctx.model->buffers()) out_.parameter_bytes += b.nbytes();
        }
        if (accounted) {
          const MemoryStats s = memory_stats(ctx.device);
          out_.allocated_at_start = s.allocated;
          out_.limit = s.limit;
        }
        break;
      }
      case Event::BatchStart:
        if (out_.steps.empty()) {
          // The savers asked for, from the first step on (the optimizer has no state yet: the
          // conversion allocates nothing inside the step's window).
          if (blocks_ != 0) control.checkpointed_blocks = blocks_ < 0 ? ctx.state.model_blocks : blocks_;
          if (bits_ != 0) control.optimizer_moment_bits = bits_;
          if (offload_) control.optimizer_offload = true;
        }
        if (accounted) reset_peak_memory(ctx.device);
        if (has_memory_categories(ctx.device)) reset_peak_breakdown(ctx.device);
        start_ = std::chrono::steady_clock::now();
        forward_backward_ = 0;
        break;
      case Event::BeforeOptimizerStep:
        optimizer_start_ = std::chrono::steady_clock::now();
        if (accounted) {
          forward_backward_ = memory_stats(ctx.device).peak_allocated;
          reset_peak_memory(ctx.device);
        }
        break;
      case Event::BatchEnd: {
        StepRecord r;
        const auto now = std::chrono::steady_clock::now();
        r.seconds = std::chrono::duration<double>(now - start_).count();
        if (optimizer_start_ > start_)
          r.optimizer_seconds = std::chrono::duration<double>(now - optimizer_start_).count();
        r.samples = ctx.state.batch_size;
        r.micro_batch = ctx.state.micro_batch_size;
        out_.checkpointed_blocks = ctx.state.checkpointed_blocks;
        out_.model_blocks = ctx.state.model_blocks;
        out_.moment_bits = ctx.state.optimizer_moment_bits;
        out_.optimizer_offload = ctx.state.optimizer_offload;
        if (accounted) {
          const MemoryStats s = memory_stats(ctx.device);
          r.peak = std::max(forward_backward_, s.peak_allocated);
          r.peak_forward_backward = forward_backward_ > 0 ? forward_backward_ : s.peak_allocated;
          r.peak_optimizer_step = forward_backward_ > 0 ? s.peak_allocated : 0;
          r.reserved = s.reserved;
        }
        if (has_memory_categories(ctx.device)) r.split = peak_memory_breakdown(ctx.device);
        out_.steps.push_back(r);
        if (ctx.optimizer && ctx.model)
          out_.optimizer_bytes = optimizer_state_bytes(*ctx.optimizer, ctx.model->parameters());
        break;
      }
      case Event::EvalStart:
        if (accounted) {
          reset_peak_memory(ctx.device);
          out_.eval_allocated_at_start = memory_stats(ctx.device).allocated;
        }
        if (ctx.test_set && ctx.config) {
          out_.eval_samples = std::min(EvalSettings::from(ctx.config->sub("eval")).batch_size, ctx.test_set->size());
        }
        break;
      case Event::EvalEnd:
        if (accounted) out_.eval_peak = memory_stats(ctx.device).peak_allocated;
        break;
      case Event::OutOfMemory:
        if (!out_.out_of_memory && ctx.oom) {
          out_.oom_phase = ctx.oom->phase;
          out_.oom_micro_batch = ctx.oom->micro_batch_size;
        }
        out_.out_of_memory = true;
        break;
      default:
        break;
    }
  }

 private:
  ShortRunResult& out_;
  std::int64_t blocks_;  ///< ShortRunSpec::checkpointed_blocks
  int bits_;             ///< ShortRunSpec::moment_bits
  bool offload_;         ///< ShortRunSpec::offload
  std::chrono::steady_clock::time_point start_, optimizer_start_;
  std::int64_t forward_backward_ = 0;  ///< the step's peak up to BeforeOptimizerStep
};

std::string toml_string_array(const std::vector<std::string>& items) {
  std::string s = "[";
  for (std::size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + json_quote(items[i]);
  return s + "]";
}

}  // namespace

const std::vector<std::string>& unmeasured_plugins() {
  static const std::vector<std::string> names{"mlflow", "console"};
  return names;
}

std::int64_t ShortRunResult::peak() const {
  std::int64_t p = 0;
  for (const auto& s : steps) p = std::max(p, s.peak);
  return p;
}

std::int64_t ShortRunResult::peak_forward_backward() const {
  std::int64_t p = 0;
  for (const auto& s : steps) p = std::max(p, s.peak_forward_backward);
  return p;
}

std::int64_t ShortRunResult::peak_optimizer_step() const {
  std::int64_t p = 0;
  for (const auto& s : steps) p = std::max(p, s.peak_optimizer_step);
  return p;
}

std::int64_t ShortRunResult::reserved() const {
  std::int64_t p = -1, r = 0;
  for (const auto& s : steps) {
    if (s.peak > p) p = s.peak, r = s.reserved;
  }
  return r;
}

namespace {
std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int sig) {
  g_stop.store(true);
  request_interrupt();
  std::signal(sig, SIG_DFL);
}

void throw_if_stopped() {
  if (g_stop.load()) throw Interrupted("interrupted by a signal");
}

/// The run's own directory: made by mkdtemp (a new name, mode 0700, this process's alone) in
/// spec.work_dir or $TMPDIR, and removed with everything in it when this goes. A folder of a
/// predictable name that another user created there first is never used, written through or
/// removed.
class PrivateDir {
 public:
  explicit PrivateDir(const ShortRunSpec& spec) {
    std::error_code ec;
    const fs::path base = spec.work_dir.empty() ? fs::temp_directory_path(ec) : fs::path(spec.work_dir);
    TRAINER_CHECK(!ec, "no folder for the measured run's directory ($TMPDIR): ", ec.message());
    if (!spec.work_dir.empty()) fs::create_directories(base, ec);
    std::string name = (base / ("trainer-" + spec.label + "-XXXXXX")).string();
    TRAINER_CHECK(::mkdtemp(name.data()) != nullptr, "cannot create a directory for the measured run in ",
                  base.string(), ": ", std::strerror(errno));
    path_ = std::move(name);
  }
  ~PrivateDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  PrivateDir(const PrivateDir&) = delete;
  PrivateDir& operator=(const PrivateDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};
}  // namespace

void request_stop() noexcept { g_stop.store(true); }

void stop_on_signals() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

ShortRunResult run_short(const ShortRunSpec& spec) {
  throw_if_stopped();
  // Which plugins.load entries stay: loaded once as the user's run would be, to learn the
  // name behind each entry (an entry may be a path to a .so).
  const PreparedRun as_given = prepare_run(spec.recipe, spec.overrides, spec.plugin_dirs);
  const auto entries = as_given.config.get_or<std::vector<std::string>>("plugins.load", {});
  std::vector<std::string> kept;
  for (std::size_t i = 0; i < entries.size() && i < as_given.plugins.size(); ++i) {
    const std::string n = as_given.plugins[i]->name();
    const auto& dropped = unmeasured_plugins();
    if (std::find(dropped.begin(), dropped.end(), n) != dropped.end()) continue;
    if (n == "oom_backoff" && !spec.keep_oom_backoff) continue;
    kept.push_back(entries[i]);
  }
  std::vector<std::string> overrides = spec.overrides;
  const auto add = [&overrides](const std::string& key, const std::string& value) {
    overrides.push_back(key + "=" + value);
  };
  if (spec.batch_size > 0) add("training.batch_size", std::to_string(spec.batch_size));
  if (spec.micro_batch > 0) add("training.micro_batch_size", std::to_string(spec.micro_batch));
  add("training.max_steps", std::to_string(spec.steps));
  // The test split stays loaded as the recipe has it (it is memory the run holds). An
  // evaluation at the end runs when asked for, or when the recipe has one anyway: on one batch.
  // Otherwise the recipe's end evaluation (eval.at_end, the default) sees one sample only.
  const bool evaluates_at_end = spec.evaluate || EvalSettings::from(as_given.config.sub("eval")).at_end;
  if (spec.evaluate) {
    add("eval.at_end", "true");
    if (spec.eval_batch > 0) add("eval.batch_size", std::to_string(spec.eval_batch));
  } else if (evaluates_at_end) {
    add("eval.batch_size", "1");
  }
  if (evaluates_at_end) add("eval.limit_batches", "1");
  add("checkpoint.every_epochs", "0");
  add("checkpoint.every_steps", "0");
  add("checkpoint.at_end", "false");
  add("checkpoint.autoresume", "false");  // a measurement starts afresh, whatever the recipe says
  add("metrics.jsonl", "false");
  add("metrics.console", "false");
  if (!spec.keep_budget) {
    add("memory.limit_mb", "0");
    add("memory.fraction", "0");
  }
  add("plugins.load", toml_string_array(kept));
  PreparedRun prepared = prepare_run(spec.recipe, overrides, spec.plugin_dirs);

  ShortRunResult out;
  for (const auto& p : prepared.plugins) out.plugins.push_back(p->name());
  TrainerOptions options;
  options.config = prepared.config;
  options.plugins = prepared.plugins;
  options.plugins.push_back(std::make_shared<MeasurePlugin>(out, spec));
  const PrivateDir dir(spec);
  options.run_dir = dir.path();
  options.log_level = "off";  // a failure is in the result; an expected out-of-memory error is not news
  {
    const c10::Device cpu(c10::kCPU);
    install_cpu_tracking_allocator();
    out.allocated_before = memory_stats(cpu).allocated;
  }
  // A run points the process's default logger at its own directory and level; the caller's
  // comes back afterwards (the probe's directory is about to go).
  const auto logger = default_logger();
  const auto caller_level = logger->level();
  const auto caller_sinks = logger->sinks();
  {
    Trainer t(std::move(options));
    const RunResult r = t.fit();
    out.exit_code = r.exit_code;
    out.status = r.status;
    out.message = r.message;
  }
  logger->sinks() = caller_sinks;
  logger->set_level(caller_level);
  // Gives cached memory back, so that the next run in this process starts from the same place.
  if (!out.device.empty()) clear_memory(c10::Device(out.device), /*force=*/true);
  throw_if_stopped();
  return out;
}

}  // namespace trainer::tune
