#pragma once
#include <map>
#include <string>

#include "trainer/export.h"

namespace trainer {

/// Evaluates the model as it is now on the samples the current evaluation covers, and returns
/// the task's metrics, unprefixed ("loss", "accuracy", …): for a plugin that evaluates other
/// weights beside the model's (the ema plugin swaps its averaged weights in, calls this, adds
/// "eval/ema/accuracy" … to ctx.eval_metrics and swaps the weights back). Only from an
/// EvalMetrics handler (trainer::Error otherwise); not from within itself.
///
/// No event fires; the plugins' forward scopes (autocast) apply as in the evaluation; the batch
/// is the one the evaluation settled on, and an out-of-memory error is not retried (the run
/// fails as out of memory in Eval). In a data-parallel run each rank evaluates its part and
/// the metrics cover every sample, so every rank must call it (EvalMetrics fires on each).
TRAINER_API std::map<std::string, double> evaluate_now();

}  // namespace trainer
