#pragma once
// Private: where the memory of the run's device went, over the run. Before the plugins see an
// event, the timeline counts what the core knows by identity as what it is (parameters and
// buffers, gradients, optimizer state) and samples the live memory by category at the step's
// events; one line per step (and per evaluation and out-of-memory error) goes to
// RUN_DIR/memory.jsonl, which moves to memory.1.jsonl when it reaches memory.timeline_lines.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "trainer/context.h"
#include "trainer/core_settings.h"
#include "trainer/events.h"
#include "trainer/memory.h"
#include "trainer/memory_snapshot.h"

namespace spdlog {
class logger;
}

namespace trainer {

/// Counts `model`'s parameters and buffers as Parameters, their gradients as Gradients and
/// `optim`'s state as OptimizerState (either may be null).
void attribute_run_memory(const Model* model, torch::optim::Optimizer* optim);

/// Writes `s`, the snapshot of an out-of-memory error, as
/// RUN_DIR/memory/oom-<step>-<phase>-<attempt>.json and .pickle (memory/rank-<r>/… for ranks
/// other than 0) and keeps the newest `keep` there. Returns its path relative to `run_dir`; "" when `keep` is
/// 0 or the write failed (`log` warned: a snapshot never fails the run). A non-empty
/// `allocator_pickle` (CUDA: the caching allocator's own snapshot at the refusal) goes beside
/// them as <name>.allocator.pickle.
std::string write_oom_snapshot(const MemorySnapshot& s, const std::string& run_dir, std::int64_t rank,
                               std::int64_t keep, spdlog::logger& log, const std::string& allocator_pickle = "");

class MemoryTimeline {
 public:
  /// `path` is RUN_DIR/memory.jsonl ("" = write nothing); `log` hears of a write that failed.
  MemoryTimeline(const MemorySettings& s, std::string path, std::shared_ptr<spdlog::logger> log);
  ~MemoryTimeline();
  MemoryTimeline(const MemoryTimeline&) = delete;
  MemoryTimeline& operator=(const MemoryTimeline&) = delete;

  /// `e` is about to be fired with `ctx` (its model, optimizer, device) and `state`.
  void observe(Event e, const RunState& state, const EventContext& ctx, const OomInfo* oom);

 private:
  void write(const std::string& line);

  std::int64_t every_;
  std::int64_t max_lines_;
  std::string path_;
  std::shared_ptr<spdlog::logger> log_;
  std::FILE* file_ = nullptr;
  std::int64_t lines_ = 0;  ///< in the current file
  bool failed_ = false;     ///< a write failed once: the timeline stopped (warned)
  bool stepped_ = false;    ///< the optimizer stepped since BatchStart
  MemoryBreakdown start_, forward_, backward_, step_;
  std::vector<at::Tensor> params_;  ///< the model's, as of its last change (ModelToDevice … FitStart)
  std::size_t state_entries_ = 0;   ///< the optimizer's per-parameter states when last attributed
};

}  // namespace trainer
