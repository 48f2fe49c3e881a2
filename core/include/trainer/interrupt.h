#pragma once
#include "trainer/export.h"

namespace trainer {

/// A process-wide "stop soon" flag. SIGINT/SIGTERM set it while a Trainer runs with
/// `TrainerOptions::handle_signals`; the loop stops at its next safe point (checkpoint,
/// exit code 130), and plugins that wait (device_select) poll it to stop waiting.
/// Trainer::fit() clears the flag when a run starts, so a request left by an earlier run in
/// the same process does not stop the next one. The first three are async-signal-safe and
/// thread-safe.

/// Asks every running Trainer in this process to stop at its next safe point, as if SIGINT
/// had arrived (what the signal handler calls).
TRAINER_API void request_interrupt() noexcept;
/// True once SIGINT/SIGTERM arrived (or request_interrupt was called) and not cleared.
TRAINER_API bool interrupt_requested() noexcept;
/// Clears a pending interrupt request.
TRAINER_API void clear_interrupt() noexcept;
/// Throws Interrupted ("interrupted by a signal while <during>") when an interrupt is pending:
/// what a long phase outside the step calls every so often (every batch of a feature cache,
/// every few thousand rows of a scan) to answer Ctrl-C within a second.
TRAINER_API void throw_if_interrupted(const char* during);

}  // namespace trainer
