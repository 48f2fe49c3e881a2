#pragma once
// Private: exception messages for logs, status.json and OomInfo.
#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace trainer::detail {

/// An exception's message without LibTorch's C++ backtrace.
inline std::string error_text(const std::exception& e) {
  if (const auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}

}  // namespace trainer::detail
