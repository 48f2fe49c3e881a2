#include "train/checkpoint.h"
#include "memory/backend.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include "model/bert.h"
#include "model/script_archive.h"
#include "model/tensor_archive.h"
#include "model/torchscript.h"
#include "optim/adamw8bit.h"
#include "train/checkpoint_files.h"
#include "train/hooks.h"
#include "train/oom_recovery.h"
#include "train/setup.h"
#include "train/train_metrics.h"
#include "trainer/config.h"
#include "trainer/distributed.h"
#include "trainer/memory.h"
#include "trainer/optim.h"
#include "util/error_text.h"

namespace fs = std::filesystem;

namespace trainer {

namespace {

/// 3: the model holds only what trains and the buffers, over the frozen base "frozen_base"
/// digests (written only then: a checkpoint of a model that trains whole is format 2). 2: the
/// position counts samples of the epoch; the data order and the device generator are
/// recorded. 1 (no "format" key): the position counted batches.
constexpr std::int64_t kFormat = 3;
constexpr std::int64_t kWholeModelFormat = 2;

std::int64_t scalar(torch::serialize::InputArchive& ar, const std::string& key) {
  at::Tensor t;
  ar.read(key, t);
  return t.item<std::int64_t>();
}

bool try_scalar(torch::serialize::InputArchive& ar, const std::string& key, std::int64_t& out) {
  at::Tensor t;
  if (!ar.try_read(key, t)) return false;
  out = t.item<std::int64_t>();
  return true;
}

std::string shape_text(at::IntArrayRef sizes) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << ']';
  return os.str();
}

/// Every parameter and buffer of `model` by name, with its shape.
std::map<std::string, std::vector<std::int64_t>> shapes_of(Model& model) {
  std::map<std::string, std::vector<std::int64_t>> out;
  for (const auto& p : model.named_parameters()) out[p.key()] = p.value().sizes().vec();
  for (const auto& b : model.named_buffers()) out[b.key()] = b.value().sizes().vec();
  return out;
}

/// An out-of-memory error while loading is what it is (exit code 3), not a format error.
[[noreturn]] void throw_load_failure(const c10::Error& e, const std::string& file, const c10::Device& device,
                                     const std::string& what) {
  if (is_out_of_memory(e)) {
    throw OomFailure(
        fmt::format("out of memory while loading checkpoint {} onto {}: {}", file, device.str(), detail::error_text(e)),
        std::nullopt);  // not in a phase of the loop
  }
  throw UsageError(fmt::format("cannot resume from {}: {}: {}", file, what, detail::error_text(e)));
}

}  // namespace

Checkpointer::Checkpointer(const CheckpointSettings& settings, std::string dir, DataOrder order, std::string config,
                           RunParts& parts, RunState& state, Hooks& hooks, OomRecovery& oom, TrainMetrics& window,
                           const Evaluator& evaluator, spdlog::logger& log)
    : settings_(settings),
      dir_(std::move(dir)),
      order_(std::move(order)),
      config_(std::move(config)),
      parts_(parts),
      state_(state),
      hooks_(hooks),
      oom_(oom),
      window_(window),
      log_(log),
      evaluator_(evaluator) {
  // The frozen weights as the run starts (from files): checkpoints hold what trains over them
  // while they stay so.
  if (parts_.base_from_file && !detail::frozen_parameters(*parts_.model).empty()) {
    start_base_ = frozen_base_.of(*parts_.model);
  }
}

std::string Checkpointer::save(Position next, bool together) {
  // Saved already at this step and position (every_steps on an epoch's last batch, then the
  // epoch's checkpoint): the same file again would only reopen the window of a rewrite. Every
  // rank tracks this alike, so that every rank makes the same saves together.
  if (saved_step_ == state_.global_step && saved_position_.epoch == next.epoch &&
      saved_position_.sample == next.sample) {
    return last_;
  }
  ProcessGroup* group = together ? parts_.group.get() : nullptr;
  if (!group && !parts_.writer()) return {};  // rank 0 writes alone: the ranks may not be in step
  saved_step_ = state_.global_step;
  saved_position_ = next;
  TrainMetrics::Pause pause(window_);
  const std::string name = "checkpoint/" + std::to_string(++saves_);
  const GeneratorStates generators = gather_generator_states(group, parts_.device, name);
  if (parts_.writer()) {
    try {
      oom_.retry(OomRetry::Once, 0, 0, [&](std::int64_t) { write(next, generators); });
    } catch (const OomFailure& e) {
      log_.error("checkpoint skipped: {}", e.what());
    }
  }
  // The others wait for rank 0's write outside the collectives, however long a large model or a
  // slow disk takes, as long as rank 0 is alive.
  if (group) group->wait_for_root(name, "writing a checkpoint");
  return last_;
}

void Checkpointer::write(Position next, const GeneratorStates& generators) {
  detail::MemoryTagScope other(MemoryCategory::Other, 0);  // whatever the phase before: this comes back after
  oom_.enter(OomPhase::Checkpoint);
  torch::serialize::OutputArchive ar, o;
  torch::serialize::OutputArchive m(ar.compilation_unit());
  // A model that trains in part (LoRA adapters, a probe's head) over weights read from files is
  // saved without its frozen weights, which a resume reads again: what trains and the buffers,
  // and the digest of the frozen base they apply to. Frozen weights that are not a file's (a
  // random initialisation differs between CPUs) or that changed since the start (a plugin
  // wrote them) are saved with the rest.
  bool partly = !start_base_.empty();
  if (partly && frozen_base_.of(*parts_.model) != start_base_) {
    partly = false;
    if (!warned_base_) {
      log_.warn(
          "frozen parameters changed since the run started (a plugin wrote them): checkpoints hold the "
          "whole model");
      warned_base_ = true;
    }
  }
  if (partly) {
    detail::write_nested(m, detail::trained_state(*parts_.model));
    ar.write("frozen_base", c10::IValue(frozen_base_.of(*parts_.model)));
  } else {
    parts_.model->save(m);
  }
  parts_.optim->save(o);
  ar.write("model", m);
  ar.write("optimizer", o);
  ar.write("format", at::tensor(partly ? kFormat : kWholeModelFormat));
  ar.write("epoch", at::tensor(next.epoch));
  ar.write("sample_in_epoch", at::tensor(next.sample));
  ar.write("global_step", at::tensor(state_.global_step));
  ar.write("samples_seen", at::tensor(state_.samples_seen));
  ar.write("eval_batch", at::tensor(parts_.eval_batch));
  oom_.rungs().save(ar);  // the memory savers on: a resume starts with them
  ar.write("data_order", c10::IValue(detail::data_order_text(order_)));
  ar.write("config", c10::IValue(config_));
  detail::write_plugin_states(ar, hooks_.save_states());
  write_generator_states(ar, generators);
  const std::optional<double> score = score_now();
  const std::string name = checkpoint_name(state_.global_step);
  const std::string file = (fs::path(dir_) / name).string();
  std::error_code ec;
  fs::remove(file + ".score", ec);  // a score goes only with the file it was written with, once that is there
  write_checkpoint_file(file, [&](std::ostream& out) { ar.save_to(out); });
  if (score) write_score(file, settings_.monitor, *score);
  point_latest(dir_, name);
  // A model from Python also leaves its TorchScript module with these weights in the run
  // directory, for torch.jit.load.
  save_torchscript_module(*parts_.model, (fs::path(dir_).parent_path() / kTorchScriptModuleFile).string());
  // A model "bert" leaves a Hugging Face model directory with these weights, for from_pretrained.
  save_hf_directory(*parts_.model, (fs::path(dir_).parent_path() / kHfModelDir).string());
  // Older checkpoints go only once the new one and `latest` are on the disk.
  files_.erase(std::remove(files_.begin(), files_.end(), file), files_.end());
  files_.push_back(file);
  scores_.erase(file);
  if (score) scores_[file] = *score;
  prune();
  last_ = file;
  log_.info("checkpoint written: {}", last_);
  hooks_.context().checkpoint_path = last_;
  hooks_.fire(Event::Checkpoint);
}

void Checkpointer::save_final(Position next, bool params_consistent, bool together) {
  if (!settings_.at_end) return;
  if (!params_consistent) {
    log_.error("no final checkpoint: parameters may be partly updated after a failure inside the optimizer step");
    return;
  }
  if (saved_step_ == state_.global_step) return;
  try {
    save(next, together);
  } catch (const std::exception& e) {
    log_.error("final checkpoint failed: {}", e.what());
  } catch (...) {
    log_.error("final checkpoint failed: an exception that is not a std::exception");
  }
}

Position Checkpointer::load(const std::string& path, ResumeInfo& info) {
  const ResumeCandidates candidates = resume_candidates(path);
  std::vector<std::string> passed;  // "file: why"
  for (const std::string& file : candidates.files) {
    std::optional<std::string> problem = checkpoint_problem(file);
    torch::serialize::InputArchive ar;
    if (!problem) {
      try {
        ar = detail::read_script_archive(file, parts_.device);
      } catch (const detail::ArchiveCodeError& e) {
        // Not damage, which falling back to an older checkpoint would mend: a file that trainer
        // did not write, in the place of one it did.
        throw UsageError(fmt::format(
            "--resume: checkpoint {} is not one that trainer wrote: {}. trainer reads checkpoints as data and runs "
            "no code from them; remove the file (or resume from another checkpoint, by name)",
            file, e.what()));
      } catch (const detail::TorchSaveError& e) {
        problem = std::string("it cannot be read as a checkpoint: ") + e.what();
      } catch (const c10::Error& e) {
        throw_load_failure(e, file, parts_.device, "");  // out of memory: read_script_archive passes nothing else
      }
    }
    if (problem) {
      TRAINER_CHECK_T(UsageError, !candidates.explicit_file, "--resume: checkpoint ", file,
                      " is truncated or damaged: ", *problem);
      log_.warn("checkpoint {} is truncated or damaged: {}", file, *problem);
      passed.push_back(file + ": " + *problem);
      continue;
    }
    if (!passed.empty()) log_.warn("resuming from {}, the newest complete checkpoint in {}", file, path);
    const Position at = restore(ar, file, info);
    go_on_from(file, at);
    return at;
  }
  throw UsageError(fmt::format("--resume {}: no complete checkpoint there ({})", path, fmt::join(passed, "; ")));
}

Position Checkpointer::restore(torch::serialize::InputArchive& ar, const std::string& file, ResumeInfo& info) {
  std::int64_t format = 1;
  try_scalar(ar, "format", format);
  TRAINER_CHECK_T(UsageError, format <= kFormat, "cannot resume from ", file, ": written in checkpoint format ", format,
                  " by a newer trainer; this one reads formats up to ", kFormat);
  c10::IValue config;
  if (ar.try_read("config", config) && config.isString()) loaded_config_ = config.toStringRef();
  c10::IValue order;
  if (ar.try_read("data_order", order) && order.isString()) {
    check_data_order(order.toStringRef(), file);
  } else {
    log_.warn(
        "{} does not record its data order (an older checkpoint): resuming assumes run.seed, "
        "training.shuffle, training.drop_last and the dataset are those it was written with",
        file);
  }

  restore_model(ar, file);
  // The memory savers the run had on, its optimizer's moments in the bits the file holds them in.
  oom_.rungs().restore(ar, file);
  try {
    torch::serialize::InputArchive o;
    ar.read("optimizer", o);
    parts_.optim->load(o);
  } catch (const c10::Error& e) {
    throw_load_failure(e, file, parts_.device,
                       "its optimizer state does not fit this optimizer (was it written with another optim.name?)");
  }
  // LibTorch's optimizers load whatever the file holds: their state must have each parameter's
  // shape. adamw8bit's load checks its own (flat bf16 values or 8-bit codes and per-block
  // scales), refusing what does not fit.
  if (dynamic_cast<const detail::AdamW8bit*>(parts_.optim.get()) == nullptr) {
    for (const auto& p : parts_.model->named_parameters()) {
      for (const at::Tensor& t : optimizer_state_of(*parts_.optim, p.value())) {
        TRAINER_CHECK_T(UsageError, t.sizes() == p.value().sizes(), "cannot resume from ", file,
                        ": the optimizer state of parameter '", p.key(), "' has shape ", shape_text(t.sizes()),
                        ", the parameter ", shape_text(p.value().sizes()));
      }
    }
  }

  Position at;
  at.epoch = scalar(ar, "epoch");
  if (!try_scalar(ar, "sample_in_epoch", at.sample)) {
    at.sample = scalar(ar, "batch_in_epoch") * state_.batch_size;
    log_.warn(
        "{} records its position in batches (an older checkpoint): resuming assumes training.batch_size = {} "
        "is the one it was written with",
        file, state_.batch_size);
  }
  state_.global_step = scalar(ar, "global_step");
  state_.samples_seen = scalar(ar, "samples_seen");
  std::int64_t eval_batch = 0;
  if (try_scalar(ar, "eval_batch", eval_batch) && eval_batch > 0 && eval_batch < parts_.eval_batch) {
    log_.info(
        "evaluation batch {} (eval.batch_size {}): the size an out-of-memory retry settled on before the "
        "checkpoint",
        eval_batch, parts_.eval_batch);
    parts_.eval_batch = eval_batch;
  }
  restore_generator_states(ar, file, parts_.group.get(), parts_.device, log_);
  std::map<std::string, PluginState> plugin_states;
  try {
    plugin_states = detail::read_plugin_states(ar);
  } catch (const c10::Error& e) {
    throw_load_failure(e, file, parts_.device, "its plugin state cannot be read");
  } catch (const Error& e) {
    throw UsageError(fmt::format("cannot resume from {}: its plugin state cannot be read: {}", file, e.what()));
  }
  info.checkpoint = file;
  info.epoch = at.epoch;
  info.sample_in_epoch = at.sample;
  info.global_step = state_.global_step;
  log_.info("resumed from {}: epoch {}, sample {} of the epoch, step {}", file, at.epoch, at.sample,
            state_.global_step);
  hooks_.load_states(plugin_states, info);
  return at;
}

void Checkpointer::restore_model(torch::serialize::InputArchive& ar, const std::string& file) {
  c10::IValue base;
  if (!ar.try_read("frozen_base", base) || !base.isString()) {
    const auto shapes = shapes_of(*parts_.model);
    try {
      torch::serialize::InputArchive m;
      ar.read("model", m);
      parts_.model->load(m);
    } catch (const c10::Error& e) {
      throw_load_failure(e, file, parts_.device,
                         "it does not fit this model (was it written with other model.* settings?)");
    }
    for (const auto& [name, shape] : shapes_of(*parts_.model)) {
      const auto& expected = shapes.at(name);
      TRAINER_CHECK_T(UsageError, shape == expected, "cannot resume from ", file, ": model parameter '", name,
                      "' has shape ", shape_text(shape), " there, ", shape_text(expected),
                      " in this model (was it written with other model.* settings?)");
    }
    return;
  }
  // What trained, over the frozen weights this run starts from: those must be the ones it
  // trained over (the same model.weights, frozen alike).
  const std::string& now = frozen_base_.of(*parts_.model);
  TRAINER_CHECK_T(UsageError, now == base.toStringRef(), "cannot resume from ", file,
                  ": it holds what trained over frozen weights of digest ", base.toStringRef(),
                  "; this run's frozen weights have digest ", now,
                  " (another model.weights, or another split of what trains: plugins.lora targets, trainable or "
                  "train_head, plugins.linear_probe)",
                  parts_.weights_note.empty() ? std::string() : "; " + parts_.weights_note,
                  ". Resume with the settings and weights it was written with (the config.toml of its run holds "
                  "them), or start a new run");
  detail::NamedTensors saved;
  try {
    torch::serialize::InputArchive m;
    ar.read("model", m);
    detail::read_nested(m, "", saved);
  } catch (const c10::Error& e) {
    throw_load_failure(e, file, parts_.device, "its model cannot be read");
  }
  const detail::NamedTensors into = detail::trained_state(*parts_.model);
  for (const auto& [name, t] : into) {
    const auto it = saved.find(name);
    TRAINER_CHECK_T(UsageError, it != saved.end(), "cannot resume from ", file, ": it holds no '", name,
                    "', which trains (or is a buffer) in this model");
    TRAINER_CHECK_T(UsageError, it->second.sizes() == t.sizes(), "cannot resume from ", file, ": '", name,
                    "' has shape ", shape_text(it->second.sizes()), " there, ", shape_text(t.sizes()),
                    " in this model (was it written with other model.* or plugin settings?)");
  }
  for (const auto& [name, t] : saved) {
    TRAINER_CHECK_T(UsageError, into.count(name), "cannot resume from ", file, ": it holds '", name,
                    "', which this model does not train (was it written with other plugin settings?)");
  }
  at::NoGradGuard no_grad;
  try {
    for (const auto& [name, t] : into) t.copy_(saved.at(name));
  } catch (const c10::Error& e) {
    throw_load_failure(e, file, parts_.device, "its model cannot be copied into this one");
  }
}

void Checkpointer::go_on_from(const std::string& file, Position at) {
  std::error_code ec;
  bool in_place = fs::equivalent(fs::path(file).parent_path(), dir_, ec);
  // Every rank tracks its saves alike (they are made together): rank 0's view decides.
  if (parts_.group) in_place = parts_.group->share("resume/in_place", in_place ? "1" : "0") == "1";
  if (!in_place) return;
  std::string moved;
  if (parts_.writer()) {
    files_ = adopt_checkpoints(dir_, file, moved);
    best_.clear();
    for (const auto& f : files_) {
      if (const auto score = settings_.monitor.empty() ? std::nullopt : read_score(f, settings_.monitor)) {
        scores_[f] = *score;
      }
    }
    point_at_best(ranked());  // one moved aside may have been the best
    if (!moved.empty()) {
      log_.warn("resuming in place from an earlier checkpoint: the later ones ({}) are not this run's course; moved",
                moved);
    }
  }
  last_ = file;
  saved_step_ = state_.global_step;  // a run that trains nothing more does not write this checkpoint again
  saved_position_ = at;
}

}  // namespace trainer
