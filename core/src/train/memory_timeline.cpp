#include "train/memory_timeline.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <utility>
#include <vector>

#include "trainer/optim.h"
#include "trainer/states.h"
#include "util/durable_file.h"

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

/// Opens `path` (a run directory's file: untrusted) for appending, or anew (`fresh`): neither
/// through a link nor when it is not a regular file (a FIFO would block, a device never end).
/// Null with errno set when it cannot be.
std::FILE* open_own_file(const std::string& path, bool fresh) {
  try {
    FileDescriptor fd = fresh ? create_new_file(path) : open_for_append(path);
    std::FILE* f = ::fdopen(fd.get(), fresh ? "w" : "a");
    if (f) fd.release();
    return f;
  } catch (const std::exception&) {
    if (errno == 0) errno = EINVAL;
    return nullptr;
  }
}

/// Lines in the regular file at `path`, counted up to `most` (a file that holds that many moves
/// aside anyway): a run resumed in place goes on counting. 0 when there is none or it is not a
/// regular file. `cut` tells whether its last line has no end (the run that wrote it was killed
/// mid-line).
std::int64_t count_lines(const std::string& path, std::int64_t most, bool& cut) {
  cut = false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
    ::close(fd);
    return 0;
  }
  char last = '\n';
  if (::pread(fd, &last, 1, st.st_size - 1) != 1) last = '\n';
  cut = last != '\n';
  std::int64_t n = cut ? 1 : 0;
  char buf[1 << 16];
  std::int64_t scanned = 0;
  for (ssize_t got; n < most && (got = ::read(fd, buf, sizeof buf)) > 0;) {
    n += std::count(buf, buf + got, '\n');
    // Lines this long are not the core's: a file that large counts as full (and moves aside).
    if ((scanned += got) > (std::int64_t{64} << 20)) n = most;
  }
  ::close(fd);
  return n;
}

}  // namespace

std::string write_oom_snapshot(const MemorySnapshot& s, const std::string& run_dir, std::int64_t rank,
                               std::int64_t keep, spdlog::logger& log, const std::string& allocator_pickle) {
  if (keep <= 0 || run_dir.empty()) return "";
  const std::string rel_dir = rank > 0 ? "memory/rank-" + std::to_string(rank) : std::string("memory");
  // Zero-padded, so that names sort as steps and attempts do (at most OomRecovery::kMaxAttempts).
  const std::string name =
      fmt::format("oom-{:08d}-{}-{:02d}", s.step, s.phase.empty() ? "none" : s.phase, s.attempt + 1);
  const fs::path dir = fs::path(run_dir) / rel_dir;
  const fs::path json = dir / (name + ".json");
  try {
    // memory/ (and memory/rank-N/) never through a link: a snapshot lands in the run directory.
    make_run_subdir((fs::path(run_dir) / "memory").string());
    if (rank > 0) make_run_subdir(dir.string());
    write_memory_snapshot(s, (dir / name).string());
  } catch (const std::exception& e) {
    std::error_code ec;
    if (!fs::exists(json, ec)) {
      log.warn("the out-of-memory snapshot {}/{}.json was not written: {}", rel_dir, name, e.what());
      return "";
    }
    log.warn("the out-of-memory snapshot {}/{}.pickle was not written: {}", rel_dir, name, e.what());
  }
  const fs::path allocator_file = dir / (name + ".allocator.pickle");
  if (!allocator_pickle.empty()) {
    try {
      detail::write_atomic(allocator_file.string(), allocator_pickle);
    } catch (const std::exception& e) {
      log.warn("the allocator's snapshot {}/{}.allocator.pickle was not written: {}", rel_dir, name, e.what());
    }
  } else {
    std::error_code gone;
    fs::remove(allocator_file, gone);  // an earlier process's, under the same name: not this snapshot's
  }
  // The newest `keep` (each a .json and its .pickle): by time written, then by step and attempt
  // (the names' order but for the phase between them). A directory that cannot be listed whole
  // keeps everything; a file that cannot be removed stays: the next snapshot tries again.
  struct Kept {
    fs::file_time_type when;
    std::string step, attempt;
    fs::path path;
    bool operator<(const Kept& o) const {
      return std::tie(when, step, attempt, path) < std::tie(o.when, o.step, o.attempt, o.path);
    }
  };
  std::vector<Kept> kept;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& file = it->path();
    const std::string stem = file.stem().string();  // oom-<step>-<phase>-<attempt>
    std::error_code bad;
    const auto when = it->last_write_time(bad);
    if (!bad && it->is_regular_file(bad) && !bad && stem.rfind("oom-", 0) == 0 && file.extension() == ".json" &&
        stem.size() > 12) {
      kept.push_back({when, stem.substr(4, 8), stem.substr(stem.rfind('-') + 1), file});
    }
  }
  if (ec) return rel_dir + "/" + name + ".json";
  std::sort(kept.begin(), kept.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < kept.size(); ++i) {
    fs::path pickle = kept[i].path, allocator = kept[i].path;
    pickle.replace_extension(".pickle");
    allocator.replace_extension(".allocator.pickle");
    for (const fs::path& old : {kept[i].path, pickle, allocator}) {
      if (fs::remove(old, ec); ec) {
        log.warn("could not remove the old out-of-memory snapshot {}: {}", old.string(), ec.message());
      }
    }
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
    bool cut = false;
    lines_ = count_lines(path_, max_lines_, cut);
    file_ = open_own_file(path_, /*fresh=*/false);
    // A line cut short stays a line of its own (readers skip it), not the start of this one.
    if (file_ && cut && std::fputc('\n', file_) == EOF) {
      std::fclose(file_);
      file_ = nullptr;
    }
  }
  if (file_ && lines_ >= max_lines_) {
    std::fclose(file_);
    std::error_code ec;
    fs::path older(path_);  // memory.jsonl -> memory.1.jsonl
    older.replace_extension(".1" + older.extension().string());
    fs::rename(path_, older, ec);
    file_ = open_own_file(path_, /*fresh=*/!ec);
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
      state_entries_ = ctx.optimizer ? ctx.optimizer->state().size() : 0;
      break;
    case Event::BatchStart:
      reset_peak_breakdown(ctx.device);
      start_ = memory_breakdown(ctx.device);
      forward_ = backward_ = step_ = MemoryBreakdown{};
      stepped_ = false;
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
      // The state an optimizer created in its step (LibTorch's create theirs at the first one;
      // they change it in place after).
      if (ctx.optimizer && ctx.optimizer->state().size() != state_entries_) {
        attribute_run_memory(nullptr, ctx.optimizer);
        state_entries_ = ctx.optimizer->state().size();
      }
      step_ = memory_breakdown(ctx.device);
      stepped_ = true;
      break;
    case Event::BatchEnd:
      // One line per optimizer step: a batch skipped (a plugin's skip, a non-finite loss) took none.
      if (stepped_ && every_ > 0 && state.global_step % every_ == 0) {
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
      reset_peak_breakdown(ctx.device);  // the retry's peak and points are its own
      forward_ = backward_ = step_ = MemoryBreakdown{};
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
