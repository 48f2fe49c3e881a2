#include "train/checkpoint.h"

#include <spdlog/spdlog.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "train/hooks.h"
#include "train/oom_recovery.h"
#include "train/run_dir.h"
#include "train/setup.h"
#include "train/train_metrics.h"

namespace fs = std::filesystem;

namespace trainer {

namespace {

std::int64_t scalar(torch::serialize::InputArchive& ar, const std::string& key) {
  at::Tensor t;
  ar.read(key, t);
  return t.item<std::int64_t>();
}

/// A checkpoint file, or the file `checkpoints/latest` names in a run directory.
std::string resolve(const std::string& path) {
  fs::path p(path);
  if (fs::is_directory(p)) {
    const fs::path dir = fs::exists(p / "checkpoints" / "latest") ? p / "checkpoints" : p;
    std::ifstream in(dir / "latest");
    std::string name;
    TRAINER_CHECK_T(UsageError, in && std::getline(in, name) && !name.empty(), "--resume ", path,
                    ": no checkpoints/latest in that directory");
    p = dir / name;
  }
  TRAINER_CHECK_T(UsageError, fs::is_regular_file(p), "--resume: checkpoint ", p.string(), " not found");
  return p.string();
}

}  // namespace

Checkpointer::Checkpointer(const CheckpointSettings& settings, std::string dir, RunParts& parts, RunState& state,
                           Hooks& hooks, OomRecovery& oom, TrainMetrics& window, spdlog::logger& log)
    : settings_(settings),
      dir_(std::move(dir)),
      parts_(parts),
      state_(state),
      hooks_(hooks),
      oom_(oom),
      window_(window),
      log_(log) {}

std::string Checkpointer::save(Position next) {
  TrainMetrics::Pause pause(window_);
  try {
    oom_.retry(OomRetry::Once, 0, 0, [&](std::int64_t) { write(next); });
  } catch (const OomFailure& e) {
    log_.error("checkpoint skipped: {}", e.what());
  }
  return last_;
}

void Checkpointer::write(Position next) {
  oom_.enter("checkpoint");
  torch::serialize::OutputArchive ar, m, o;
  parts_.model->save(m);
  parts_.optim->save(o);
  ar.write("model", m);
  ar.write("optimizer", o);
  ar.write("epoch", at::tensor(next.epoch));
  ar.write("batch_in_epoch", at::tensor(next.batch));
  ar.write("global_step", at::tensor(state_.global_step));
  ar.write("samples_seen", at::tensor(state_.samples_seen));
  ar.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state());
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld.pt", static_cast<long long>(state_.global_step));
  const std::string file = (fs::path(dir_) / name).string();
  ar.save_to(file + ".tmp");
  fs::rename(file + ".tmp", file);
  write_atomic(dir_ + "/latest", std::string(name) + "\n");
  if (std::find(files_.begin(), files_.end(), file) == files_.end()) files_.push_back(file);
  while (static_cast<std::int64_t>(files_.size()) > settings_.keep_last) {
    std::error_code ec;
    fs::remove(files_.front(), ec);
    files_.erase(files_.begin());
  }
  last_ = file;
  last_step_ = state_.global_step;
  log_.info("checkpoint written: {}", last_);
  hooks_.context().checkpoint_path = last_;
  hooks_.fire(Event::Checkpoint);
}

void Checkpointer::save_final(Position next, bool params_consistent) {
  if (!settings_.at_end) return;
  if (!params_consistent) {
    log_.error("no final checkpoint: parameters may be inconsistent after an OOM inside the optimizer step");
    return;
  }
  if (!last_.empty() && last_step_ == state_.global_step) return;
  try {
    save(next);
  } catch (const std::exception& e) {
    log_.error("final checkpoint failed: {}", e.what());
  }
}

Position Checkpointer::load(const std::string& path) {
  const std::string file = resolve(path);
  torch::serialize::InputArchive ar, m, o;
  Position at;
  try {
    ar.load_from(file, parts_.device);
    ar.read("model", m);
    ar.read("optimizer", o);
    parts_.model->load(m);
    parts_.optim->load(o);
    at.epoch = scalar(ar, "epoch");
    at.batch = scalar(ar, "batch_in_epoch");
    state_.global_step = scalar(ar, "global_step");
    state_.samples_seen = scalar(ar, "samples_seen");
    at::Tensor rng;
    ar.read("rng_cpu", rng);
    at::Generator gen = at::detail::getDefaultCPUGenerator();  // shares the default generator
    gen.set_state(rng);
  } catch (const c10::Error& e) {
    throw UsageError(detail::str("cannot resume from ", file, ": ", e.what_without_backtrace(),
                                 " (was it written by this model and optimizer?)"));
  }
  if (at.batch >= state_.steps_per_epoch) at = {at.epoch + 1, 0};
  log_.info("resumed from {}: epoch {}, batch {}, step {}", file, at.epoch, at.batch, state_.global_step);
  return at;
}

}  // namespace trainer
