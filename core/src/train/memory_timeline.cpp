#include "train/memory_timeline.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "trainer/optim.h"
#include "trainer/states.h"

namespace trainer {

namespace fs = std::filesystem;

void attribute_run_memory(const Model* model, torch::optim::Optimizer* optim) {
  if (model) {
    for (const auto& p : model->parameters()) {
      attribute_memory(p, MemoryCategory::Parameters);
      if (p.grad().defined()) attribute_memory(p.grad(), MemoryCategory::Gradients);
    }
    for (const auto& b : model->buffers()) attribute_memory(b, MemoryCategory::Parameters);
  }
  if (optim) {
    for (const auto& group : optim->param_groups()) {
      for (const auto& p : group.params()) {
        for (const auto& t : optimizer_state_of(*optim, p)) attribute_memory(t, MemoryCategory::OptimizerState);
      }
    }
  }
}

namespace {

/// {"parameters":1234,…,"allocated":…}: the categories that hold bytes, and the total.
std::string json_of(const MemoryBreakdown& b, bool with_reserved) {
  std::string out = "{";
  for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) {
    if (b.bytes[i] == 0) continue;
    out += fmt::format("\"{}\":{},", memory_category_name(static_cast<MemoryCategory>(i)), b.bytes[i]);
  }
  out += fmt::format("\"allocated\":{}", b.allocated);
  if (with_reserved) out += fmt::format(",\"reserved\":{}", b.reserved);
  return out + "}";
}

/// Lines in the file at `path` (0 when there is none): a run resumed in place goes on counting.
std::int64_t count_lines(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return 0;
  std::int64_t n = 0;
  char buf[1 << 16];
  for (std::size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) {
    for (std::size_t i = 0; i < got; ++i) n += buf[i] == '\n';
  }
  std::fclose(f);
  return n;
}

}  // namespace

std::string write_oom_snapshot(const MemorySnapshot& s, const std::string& run_dir, std::int64_t rank,
                               std::int64_t keep, spdlog::logger& log) {
  if (keep <= 0 || run_dir.empty()) return "";
  const std::string rel_dir = rank > 0 ? "memory/rank-" + std::to_string(rank) : std::string("memory");
  const std::string name = fmt::format("oom-{:08d}-{}-{}", s.step, s.phase.empty() ? "none" : s.phase, s.attempt + 1);
  try {
    const fs::path dir = fs::path(run_dir) / rel_dir;
    fs::create_directories(dir);
    write_memory_snapshot(s, (dir / name).string());
    // The newest `keep`: by time written, then by name.
    std::vector<std::pair<fs::file_time_type, fs::path>> kept;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string file = entry.path().filename().string();
      if (entry.is_regular_file() && file.rfind("oom-", 0) == 0 && entry.path().extension() == ".json") {
        kept.emplace_back(entry.last_write_time(), entry.path());
      }
    }
    std::sort(kept.begin(), kept.end());
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < kept.size(); ++i) fs::remove(kept[i].second);
  } catch (const std::exception& e) {
    log.warn("the out-of-memory snapshot {}/{}.json was not written: {}", rel_dir, name, e.what());
    return "";
  }
  return rel_dir + "/" + name + ".json";
}

MemoryTimeline::MemoryTimeline(const MemorySettings& s, std::string path, std::shared_ptr<spdlog::logger> log)
    : every_(s.categories ? s.timeline_every : 0),
      max_lines_(s.timeline_lines),
      path_(std::move(path)),
      log_(std::move(log)) {
  if (path_.empty()) every_ = 0;
}

MemoryTimeline::~MemoryTimeline() {
  if (file_) std::fclose(file_);
}

void MemoryTimeline::write(const std::string& line) {
  if (every_ == 0 || failed_) return;
  if (!file_) {
    lines_ = count_lines(path_);
    file_ = std::fopen(path_.c_str(), "a");
  }
  if (file_ && lines_ >= max_lines_) {
    std::fclose(file_);
    std::error_code ec;
    fs::rename(path_, path_.substr(0, path_.size() - 6) + ".1.jsonl", ec);  // memory.jsonl -> memory.1.jsonl
    file_ = std::fopen(path_.c_str(), ec ? "a" : "w");
    lines_ = ec ? lines_ : 0;
  }
  if (!file_ || std::fputs(line.c_str(), file_) < 0 || std::fputc('\n', file_) == EOF || std::fflush(file_) != 0) {
    failed_ = true;
    log_->warn("{}: cannot write the memory timeline ({}); it stops here", path_, std::strerror(errno));
    return;
  }
  ++lines_;
}

void MemoryTimeline::observe(Event e, const RunState& state, const EventContext& ctx, const OomInfo* oom) {
  if (!has_memory_categories(ctx.device)) return;
  switch (e) {
    case Event::ModelToDevice:
    case Event::OptimizerCreated:
    case Event::Resume:
    case Event::FitStart:
      attribute_run_memory(ctx.model.get(), ctx.optimizer);
      // The model's parameters from here on (Module::parameters() names each one: too slow for every step).
      params_ = ctx.model ? ctx.model->parameters() : std::vector<at::Tensor>{};
      break;
    case Event::BatchStart:
      reset_peak_breakdown(ctx.device);
      start_ = memory_breakdown(ctx.device);
      forward_ = backward_ = step_ = MemoryBreakdown{};
      break;
    case Event::AfterForward: {
      const MemoryBreakdown b = memory_breakdown(ctx.device);
      if (b.allocated >= forward_.allocated) forward_ = b;  // the micro-batch that holds the most
      break;
    }
    case Event::AfterBackward: {
      for (const auto& p : params_) {  // the gradients it created
        if (p.grad().defined()) attribute_memory(p.grad(), MemoryCategory::Gradients);
      }
      const MemoryBreakdown b = memory_breakdown(ctx.device);
      if (b.allocated >= backward_.allocated) backward_ = b;
      break;
    }
    case Event::AfterOptimizerStep:
      attribute_run_memory(nullptr, ctx.optimizer);  // state an optimizer created in its step
      step_ = memory_breakdown(ctx.device);
      break;
    case Event::BatchEnd:
      if (every_ > 0 && state.global_step % every_ == 0) {
        write(fmt::format(
            "{{\"kind\":\"step\",\"step\":{},\"epoch\":{},\"micro_batch\":{},\"start\":{},\"forward\":{},"
            "\"backward\":{},\"optimizer_step\":{},\"peak\":{}}}",
            state.global_step, state.epoch, state.micro_batch_size, json_of(start_, true), json_of(forward_, false),
            json_of(backward_, false), json_of(step_, false), json_of(peak_memory_breakdown(ctx.device), false)));
      }
      break;
    case Event::OutOfMemory:
      if (oom) {
        write(fmt::format(
            "{{\"kind\":\"oom\",\"step\":{},\"epoch\":{},\"phase\":\"{}\",\"micro_batch\":{},"
            "\"attempt\":{},\"requested\":{},{}\"peak\":{},\"after\":{}}}",
            state.global_step, state.epoch, oom_phase_name(oom->phase), oom->micro_batch_size, oom->attempt,
            oom->requested_bytes, oom->live ? "\"live\":" + json_of(*oom->live, false) + "," : std::string(),
            json_of(peak_memory_breakdown(ctx.device), false), json_of(memory_breakdown(ctx.device), true)));
      }
      reset_peak_breakdown(ctx.device);  // the retry's peak is its own
      break;
    case Event::EvalStart:
      reset_peak_breakdown(ctx.device);
      break;
    case Event::EvalEnd:
      if (every_ > 0) {
        write(fmt::format("{{\"kind\":\"eval\",\"step\":{},\"epoch\":{},\"peak\":{}}}", state.global_step, state.epoch,
                          json_of(peak_memory_breakdown(ctx.device), false)));
      }
      break;
    default:
      break;
  }
}

}  // namespace trainer
