#pragma once
// Private: the failure training.on_nonfinite = "stop" ends a run with (status FAILED, failure
// "diverged", exit code 3, no final checkpoint).
#include "trainer/error.h"

namespace trainer {

/// A NaN or infinite loss or gradient norm before an optimizer step.
class Diverged : public Error {
 public:
  using Error::Error;
};

}  // namespace trainer
