#pragma once
// Private: the task "masked_lm" (masked_lm.cpp).
#include <memory>

#include "trainer/task.h"

namespace trainer::detail {

/// Masked language modelling on a text dataset with dataset.masked_lm = true (its targets:
/// [N, L] token ids, -100 where nothing is masked; `data.token_id_limit` logits per token).
/// Throws UsageError when the data is not that.
std::unique_ptr<Task> masked_lm_task(const DataSpec& data, const Batch& probe);

}  // namespace trainer::detail
