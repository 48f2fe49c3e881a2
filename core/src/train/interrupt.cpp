#include "trainer/interrupt.h"

#include <atomic>
#include <csignal>
#include <string>

#include "train/signal_scope.h"
#include "trainer/error.h"

namespace trainer {

namespace {

std::atomic<bool> g_interrupt{false};

extern "C" void on_signal(int sig) {
  g_interrupt.store(true);
  // A second signal kills the process the ordinary way.
  std::signal(sig, SIG_DFL);
}

}  // namespace

void request_interrupt() noexcept { g_interrupt.store(true); }
bool interrupt_requested() noexcept { return g_interrupt.load(); }
void clear_interrupt() noexcept { g_interrupt.store(false); }

void throw_if_interrupted(const char* during) {
  if (g_interrupt.load()) throw Interrupted(std::string("interrupted by a signal while ") + during);
}

namespace detail {

SignalScope::SignalScope(bool enable) : enabled_(enable) {
  if (!enabled_) return;
  prev_int_ = std::signal(SIGINT, on_signal);
  prev_term_ = std::signal(SIGTERM, on_signal);
}

SignalScope::~SignalScope() {
  if (!enabled_) return;
  std::signal(SIGINT, prev_int_);
  std::signal(SIGTERM, prev_term_);
}

}  // namespace detail

}  // namespace trainer
