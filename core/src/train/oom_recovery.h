#pragma once
// Private: recovering from out-of-memory errors inside the loop. One retry helper serves the
// training step, evaluation and checkpoints: it drops the failed attempt, reports it to the
// plugins (OutOfMemory) and runs the attempt again as they ask, on another device if they
// ask, or gives up with a summary of what was tried and what to change.
#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "memory/backend.h"
#include "train/memory_rungs.h"
#include "train/oom_phase.h"
#include "train/setup.h"
#include "trainer/context.h"
#include "trainer/control.h"
#include "trainer/error.h"
#include "trainer/memory.h"

namespace spdlog {
class logger;
}

namespace trainer {

class Hooks;
class ProcessGroup;

/// How an attempt is retried after an out-of-memory error.
enum class OomRetry {
  AskPlugins,  ///< a training batch or an evaluation: retry at the size a plugin asks in OutOfMemory, else give up
  Once,        ///< a checkpoint: free cached memory and retry once by itself, then give up
};

/// An out-of-memory error that was not recovered from; the message says what was tried.
struct OomFailure : Error {
  OomFailure(const std::string& message, std::optional<OomPhase> where, std::int64_t last_micro_batch = 0)
      : Error(message), phase(where), micro_batch(last_micro_batch) {}
  std::optional<OomPhase> phase;  ///< where in the loop it happened (status.json's "phase"); none outside it
  std::int64_t micro_batch = 0;   ///< the last micro-batch size tried (status.json's "micro_batch"); 0: none
};

/// In a data-parallel step: some rank ran out of memory (this one, or another), and every rank
/// drops the attempt together. Thrown on every rank after the ranks agreed on it.
struct RanksOutOfMemory : Error {
  using Error::Error;
};

/// Sets every parameter's gradient to undefined (a failed attempt's partial gradients go).
void drop_gradients(Model& model);

class OomRecovery {
 public:
  /// At most this many attempts per batch (evaluation), whatever plugins ask.
  static constexpr std::int64_t kMaxAttempts = 64;

  OomRecovery(RunParts& parts, RunState& state, Hooks& hooks, spdlog::logger& log)
      : parts_(parts), state_(state), hooks_(hooks), log_(log), rungs_(parts, state, hooks, log) {}

  /// The memory savers plugins switch on and off (Control::checkpointed_blocks,
  /// optimizer_moment_bits): applied here for an OutOfMemory, by the step for a BatchStart.
  MemoryRungs& rungs() { return rungs_; }

  /// Names what the loop is doing: the phase an out-of-memory error is reported in, and what
  /// this thread's allocations count as from now on (oom_phase_info(phase).allocates).
  void enter(OomPhase phase) {
    phase_ = phase;
    detail::set_thread_memory_category(oom_phase_info(phase).allocates);
    detail::set_thread_memory_phase(static_cast<std::uint8_t>(static_cast<int>(phase) + 1));
    // Also the other threads' that allocate for the loop without a tag of their own (CUDA's
    // backward runs on the autograd engine's device threads).
    detail::set_run_memory_tag(oom_phase_info(phase).allocates, static_cast<std::uint8_t>(static_cast<int>(phase) + 1));
  }
  OomPhase phase() const { return phase_; }

  /// Runs `attempt(size)` until one returns. After an out-of-memory error the attempt is
  /// dropped and reported, then run again as `rule` says: `size` is the micro-batch (eval
  /// batch) and `samples` how many samples the attempt covers. Other exceptions pass through;
  /// OomFailure when it gives up. Returns the size a retry settled on, or nullopt when the
  /// first attempt succeeded.
  ///
  /// With `ranks` (a data-parallel training step, whose attempts throw RanksOutOfMemory on every
  /// rank at once), the ranks also agree on what follows: the smallest size any rank's plugins
  /// ask, or giving up on every rank when one rank's plugins give up.
  template <typename Attempt>
  std::optional<std::int64_t> retry(OomRetry rule, std::int64_t size, std::int64_t samples, Attempt&& attempt,
                                    ProcessGroup* ranks = nullptr) {
    std::vector<std::int64_t> tried;
    std::optional<std::int64_t> settled;
    for (std::int64_t n = 0;; ++n) {
      forget_refusal();
      try {
        attempt(size);
        return settled;
      } catch (const std::exception& e) {
        // With ranks, only an error the ranks agreed on is retried: any other would put this
        // rank's collectives out of step with theirs.
        if (ranks ? !dynamic_cast<const RanksOutOfMemory*>(&e) : !is_out_of_memory(e)) throw;
        size = recover(e, rule, size, samples, n, tried, ranks);
        settled = size;
      }
    }
  }

 private:
  /// Writes the snapshot of `refused` (RUN_DIR/memory, memory.snapshots kept); returns its
  /// path in the run directory, "" when none was written.
  std::string write_snapshot(const detail::Refusal& refused, const std::exception& e, std::int64_t size,
                             std::int64_t attempt);
  /// Forgets a refused allocation that an earlier attempt's code caught itself, and marks where
  /// this attempt's begin: what recover() reports is this attempt's.
  void forget_refusal();
  /// What was live at this attempt's refused allocation on the run's device (null: not known).
  detail::RefusalPtr take_refusal() const;
  /// Drops the failed attempt, fires OutOfMemory and returns the size to retry with; throws
  /// OomFailure when there is no retry.
  std::int64_t recover(const std::exception& e, OomRetry rule, std::int64_t size, std::int64_t samples,
                       std::int64_t attempt, std::vector<std::int64_t>& tried, ProcessGroup* ranks);
  /// Counts the OOM, frees cached memory and fires OutOfMemory describing what failed.
  Control report(const std::exception& e, std::int64_t size, std::int64_t samples, std::int64_t attempt,
                 bool force_clear);
  /// Moves model, buffers and optimizer state to `to` (Control.switch_device in OutOfMemory)
  /// and fires ModelToDevice.
  void move_run_to(const c10::Device& to, const std::string& reason);

  RunParts& parts_;
  RunState& state_;
  Hooks& hooks_;
  spdlog::logger& log_;
  OomPhase phase_ = OomPhase::Data;      // every path that recovers enters its phase first
  std::vector<std::string> moves_;       ///< "cuda:0 -> cpu" per device fallback, for the give-up summary
  std::optional<MemoryBreakdown> live_;  ///< what was live at the refusal being recovered from
  std::uint64_t refusal_mark_ = 0;       ///< the process's refusals before this attempt
  MemoryRungs rungs_;
};

}  // namespace trainer
