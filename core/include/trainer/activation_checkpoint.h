#pragma once
// Activation checkpointing: trade compute for memory by recomputing a block's activations in
// backward instead of keeping them from the forward.
#include <ATen/core/Tensor.h>

#include "trainer/export.h"
#include "trainer/model.h"

namespace trainer {

/// Runs `block.forward(x)` without keeping the activations inside the block and returns its
/// output; in backward the block is run again from `x` to get them, then differentiated. Only
/// the input `x` is kept per checkpointed block. The recomputation:
///   - draws the same random numbers as the forward did (the default generator of x's device
///     is set back to its state at the forward, and restored afterwards), so dropout masks match;
///   - runs under the autocast state of the forward (trainer::AutocastGuard);
///   - gives the same gradients as the plain block (bit-identical in float32 when the block's
///     kernels are deterministic), to `x` and to every parameter of the block that requires grad.
/// When grad mode is off, or neither `x` nor any parameter of the block requires grad, it is
/// just block.forward(x). Gradients go to `x` and to the block's own parameters (those that
/// required grad at the forward); a tensor the block captures from outside (a weight tied to
/// another module) gets none through the block. The block's buffers (BatchNorm's running
/// statistics and num_batches_tracked) are put back after the recomputation, so they move once
/// per forward, as without checkpointing.
TRAINER_API at::Tensor checkpoint_block(Block& block, const at::Tensor& x);

}  // namespace trainer
