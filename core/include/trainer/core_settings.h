#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/config_spec.h"
#include "trainer/devices.h"
#include "trainer/export.h"
#include "trainer/settings.h"

namespace trainer {

/// The core's config sections, one typed struct each: the members are the keys (with their
/// defaults), declare() gives each its doc and rules. `core_config_sections()` validates them;
/// the core reads them with `from(cfg.sub("<section>"))`, and so may a plugin:
/// `TrainingSettings::from(ctx.config->sub("training")).micro_batch()`.

/// [run]
struct RunSettings : Settings<RunSettings> {
  std::string name = "run";
  std::int64_t seed = 42;
  std::string dir = "runs";

  static void declare(SettingsSchema<RunSettings>& s) {
    s.add(&RunSettings::name, "name", "Run name; the run directory is <dir>/<name>-<timestamp>");
    s.add(&RunSettings::seed, "seed", "Seed of every random generator").min(0).memory_neutral();
    s.add(&RunSettings::dir, "dir", "Parent directory of run directories");
  }
};

/// [training]
struct TrainingSettings : Settings<TrainingSettings> {
  std::int64_t epochs = 1;
  std::int64_t batch_size = 64;
  std::int64_t micro_batch_size = 0;
  std::int64_t max_steps = 0;
  std::int64_t log_every = 50;
  double grad_clip_norm = 0.0;
  bool shuffle = true;
  bool drop_last = false;
  bool group_by_length = false;
  std::string on_nonfinite = "stop";
  std::int64_t max_skipped_steps = 10;

  /// Samples per forward/backward as configured: `micro_batch_size`, where 0 means
  /// `batch_size` and a larger value is clamped to it.
  std::int64_t micro_batch() const {
    return micro_batch_size > 0 ? std::min(micro_batch_size, batch_size) : batch_size;
  }

  static void declare(SettingsSchema<TrainingSettings>& s) {
    s.add(&TrainingSettings::epochs, "epochs", "Epochs to train").min(1).memory_neutral();
    s.add(&TrainingSettings::batch_size, "batch_size", "Effective batch: samples per optimizer step")
        .min(1)
        .memory_neutral();
    s.add(&TrainingSettings::micro_batch_size, "micro_batch_size", "Samples per forward/backward; 0 = batch_size")
        .min(0)
        .memory_neutral();
    s.add(&TrainingSettings::max_steps, "max_steps", "Stop after this many optimizer steps; 0 = no limit")
        .min(0)
        .memory_neutral();
    s.add(&TrainingSettings::log_every, "log_every", "Log training metrics every N optimizer steps")
        .min(1)
        .memory_neutral();
    s.add(&TrainingSettings::grad_clip_norm, "grad_clip_norm", "Clip the global gradient norm; 0 = off").min(0);
    s.add(&TrainingSettings::shuffle, "shuffle", "Shuffle the training set each epoch (from run.seed)");
    s.add(&TrainingSettings::drop_last, "drop_last", "Drop the last incomplete batch of an epoch");
    s.add(&TrainingSettings::group_by_length, "group_by_length",
          "Batch samples of similar length (a text dataset's), longest batch first: less padding");
    s.add(&TrainingSettings::on_nonfinite, "on_nonfinite",
          "A NaN or infinite loss or gradient: stop (the run fails, reason diverged), skip_step (no optimizer "
          "step for the batch) or ignore")
        .choices({"stop", "skip_step", "ignore"})
        .memory_neutral();
    s.add(&TrainingSettings::max_skipped_steps, "max_skipped_steps",
          "With on_nonfinite = skip_step: more optimizer steps than this skipped in a row (the weights unchanged "
          "meanwhile) fail the run as diverged; 0 = no limit")
        .min(0)
        .memory_neutral();
  }
};

/// [eval]
struct EvalSettings : Settings<EvalSettings> {
  std::int64_t every_epochs = 1;
  std::int64_t every_steps = 0;
  std::int64_t batch_size = 1000;
  bool at_end = true;
  std::int64_t limit_batches = 0;

  /// Whether the run evaluates at all (and so needs the test split).
  bool evaluates() const { return every_epochs > 0 || every_steps > 0 || at_end; }

  static void declare(SettingsSchema<EvalSettings>& s) {
    s.add(&EvalSettings::every_epochs, "every_epochs",
          "Evaluate every N epochs; 0 = not at epoch ends (eval.at_end still evaluates once at the end)")
        .min(0);
    s.add(&EvalSettings::every_steps, "every_steps", "Also evaluate every N optimizer steps; 0 = never").min(0);
    s.add(&EvalSettings::batch_size, "batch_size", "Evaluation batch size").min(1).memory_neutral();
    s.add(&EvalSettings::at_end, "at_end",
          "Also evaluate when training ends (its last epoch, or training.max_steps) unless that step was just "
          "evaluated; false with every_epochs = 0 and every_steps = 0: the run never evaluates");
    s.add(&EvalSettings::limit_batches, "limit_batches",
          "Evaluate on the first N x batch_size samples of the test split only; 0 = all")
        .min(0);
  }
};

/// [checkpoint]
struct CheckpointSettings : Settings<CheckpointSettings> {
  std::int64_t every_epochs = 1;
  std::int64_t every_steps = 0;
  std::int64_t keep_last = 2;
  bool at_end = true;
  bool autoresume = false;
  std::string monitor;
  std::string mode = "min";
  std::int64_t save_top_k = 1;
  bool save_last = true;

  static void declare(SettingsSchema<CheckpointSettings>& s) {
    s.add(&CheckpointSettings::every_epochs, "every_epochs", "Checkpoint every N epochs; 0 = never")
        .min(0)
        .memory_neutral();
    s.add(&CheckpointSettings::every_steps, "every_steps", "Checkpoint every N optimizer steps; 0 = never")
        .min(0)
        .memory_neutral();
    s.add(&CheckpointSettings::keep_last, "keep_last", "Checkpoints kept in <run_dir>/checkpoints")
        .min(1)
        .memory_neutral();
    s.add(&CheckpointSettings::at_end, "at_end", "Write a checkpoint when the run ends (also on failure)")
        .memory_neutral();
    s.add(&CheckpointSettings::autoresume, "autoresume",
          "With --run-dir: resume from the run directory's newest checkpoint when it has one (a requeued job)")
        .memory_neutral();
    s.add(&CheckpointSettings::monitor, "monitor",
          "Keep checkpoints by this evaluation metric (eval/accuracy, eval/loss, ...); empty = the newest keep_last")
        .memory_neutral();
    s.add(&CheckpointSettings::mode, "mode", "With monitor: min (lower is better) or max")
        .choices({"min", "max"})
        .memory_neutral();
    s.add(&CheckpointSettings::save_top_k, "save_top_k", "With monitor: the K best checkpoints kept")
        .min(1)
        .memory_neutral();
    s.add(&CheckpointSettings::save_last, "save_last",
          "With monitor: also keep the newest keep_last checkpoints (what a resume continues from)")
        .memory_neutral();
  }
};

/// [runtime]
struct RuntimeSettings : Settings<RuntimeSettings> {
  std::int64_t num_threads = 0;
  std::string device = "cpu";
  bool tune_malloc = true;

  static void declare(SettingsSchema<RuntimeSettings>& s) {
    s.add(&RuntimeSettings::num_threads, "num_threads",
          "Intra-op threads; 0 = the cores other work leaves free, chosen at the start and at each epoch")
        .min(0);
    s.add(&RuntimeSettings::device, "device",
          "Default device: cpu, cuda or cuda:N (plugins may choose in SelectDevice)")
        .check(device_setting_check());
    s.add(&RuntimeSettings::tune_malloc, "tune_malloc",
          "Keep freed tensor memory in the heap instead of returning it to the OS each step");
  }
};

/// [loader]: how training batches are read ahead of the step.
struct LoaderSettings : Settings<LoaderSettings> {
  std::int64_t workers = 0;
  std::int64_t prefetch = 4;

  static void declare(SettingsSchema<LoaderSettings>& s) {
    s.add(&LoaderSettings::workers, "workers",
          "Threads that read (decode, augment) training batches ahead of the step; 0 = read each batch in the "
          "step, on the training thread (datasets held in memory gain nothing from workers). The batches are the "
          "same whatever the number")
        .min(0);
    s.add(&LoaderSettings::prefetch, "prefetch",
          "Batches read ahead at most (the bounded queue); raised to workers when smaller")
        .min(1);
  }
};

/// [memory]
struct MemorySettings : Settings<MemorySettings> {
  double limit_mb = 0.0;
  double fraction = 0.0;
  bool categories = true;
  std::int64_t timeline_every = 1;
  std::int64_t timeline_lines = 10000;
  std::int64_t snapshots = 10;

  static void declare(SettingsSchema<MemorySettings>& s) {
    s.add(&MemorySettings::limit_mb, "limit_mb",
          "Memory budget of the run's device in MiB; past it allocations fail with a real OOM. 0 = none")
        .min(0)
        .max(1e9);
    s.add(&MemorySettings::fraction, "fraction",
          "Budget as a fraction of the device's total memory (CUDA: the caching allocator's per-process "
          "fraction). 0 = none; not together with limit_mb")
        .min(0)
        .max(1);
    s.add(&MemorySettings::categories, "categories",
          "Split the device's live memory into categories (parameters, gradients, optimizer state, activations, "
          "batch, evaluation, dataset, other): memory.jsonl, memory/* metrics, the out-of-memory log line; CPU only")
        .memory_neutral();
    s.add(&MemorySettings::timeline_every, "timeline_every",
          "Write a step's memory by category to <run_dir>/memory.jsonl every N optimizer steps; 0 = no file")
        .min(0)
        .memory_neutral();
    s.add(&MemorySettings::timeline_lines, "timeline_lines",
          "memory.jsonl moves to memory.1.jsonl (replacing it) at this many lines: at most twice this many are kept")
        .min(10)
        .max(100000000)
        .memory_neutral();
    s.add(&MemorySettings::snapshots, "snapshots",
          "Out-of-memory snapshots kept in <run_dir>/memory (oom-<step>-<phase>-<attempt>.json, the newest); 0 = "
          "none")
        .min(0)
        .max(100000)
        .memory_neutral();
  }
};

/// [metrics]
struct MetricsSettings : Settings<MetricsSettings> {
  bool jsonl = true;
  bool console = true;

  static void declare(SettingsSchema<MetricsSettings>& s) {
    s.add(&MetricsSettings::jsonl, "jsonl", "Write <run_dir>/metrics.jsonl");
    s.add(&MetricsSettings::console, "console", "Log metric groups as info lines");
  }
};

/// [plugins]
struct PluginsSettings : Settings<PluginsSettings> {
  std::vector<std::string> load;
  std::vector<std::string> path;

  static void declare(SettingsSchema<PluginsSettings>& s) {
    s.add(&PluginsSettings::load, "load", "Plugins to load, by name or .so path, in order");
    s.add(&PluginsSettings::path, "path", "Directories searched first for plugins");
  }
};

/// The core's config schema for `cfg`: the sections above, and the model/dataset/optim/sched
/// sections of the names `cfg` selects (their `name` plus the keys of that registry entry).
TRAINER_API std::vector<SectionSpec> core_config_sections(const Config& cfg);

}  // namespace trainer
