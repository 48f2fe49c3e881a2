#pragma once
// oom_backoff's ladder order: the rungs an out-of-memory error climbs, first applicable first
// (as configured, or by what was full), and the texts naming them and the savers that are on.
#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "oom_backoff_settings.h"
#include "trainer/context.h"

namespace trainer::oom_backoff {

/// The ladder plugins.oom_backoff.ladder names, checked (`key`: where it was set, for the
/// errors): its rungs in order, device last when fallback_devices are given; empty for "auto".
std::vector<Rung> configured_ladder(const OomBackoffSettings& s, const std::string& key);

/// What was full when the allocation was refused: the optimizer state (the optimizer step, or
/// the breakdown's largest category), else the activations.
bool optimizer_full(const trainer::OomInfo& oom);

/// The rungs to try, in order: the configured ladder (`order`), or for "auto" (`order` empty) by
/// what was full. With activations full, checkpointing comes before a smaller micro-batch once
/// the micro-batch is small, where halving it again costs more time per sample than recomputing
/// the blocks: on the CPU at 2 (measured, bench/memory/ladder_bench.cpp: a ViT's step at
/// micro-batches of 1 takes 28 % longer than at 2, checkpointing every block 27-34 %), on a GPU
/// at 8 (its kernels fill the device less at small batches; to be measured there).
std::vector<Rung> ladder(const std::vector<Rung>& order, const trainer::OomInfo& oom, const c10::Device& device);

/// The rungs ladder() gives, by name ("auto: " first when `order` is empty).
std::string ladder_text(const std::vector<Rung>& order, const trainer::OomInfo& oom, const c10::Device& device);

/// "6 of 12 blocks checkpointed, AdamW moments in 16 bits (inexact)": the savers on beyond the micro-batch.
std::string savers_text(const trainer::RunState& st);

}  // namespace trainer::oom_backoff
