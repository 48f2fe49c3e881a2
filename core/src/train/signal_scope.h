#pragma once
// Private: SIGINT/SIGTERM handlers that raise the interrupt flag (trainer/interrupt.h).

namespace trainer::detail {

/// Installs SIGINT/SIGTERM handlers for its lifetime (when `enable`); the handlers call
/// request_interrupt() and restore the default action, so a second signal kills the process
/// the ordinary way. The previous handlers come back on destruction.
class SignalScope {
 public:
  explicit SignalScope(bool enable);
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  bool enabled_;
  void (*prev_int_)(int) = nullptr;
  void (*prev_term_)(int) = nullptr;
};

}  // namespace trainer::detail
