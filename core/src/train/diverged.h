#pragma once
// Private: the failure a diverged run ends with (status FAILED, failure "diverged", exit code 3,
// no final checkpoint): training.on_nonfinite = "stop" at a NaN or infinity, or "skip_step" past
// training.max_skipped_steps skipped in a row.
#include "trainer/error.h"

namespace trainer {

/// A NaN or infinite loss or gradient norm before an optimizer step, or too many in a row.
class Diverged : public Error {
 public:
  using Error::Error;
};

}  // namespace trainer
