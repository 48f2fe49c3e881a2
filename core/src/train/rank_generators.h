#pragma once
// Private: the random generators in checkpoints. Every rank of a data-parallel run draws its own
// stream (dropout on its own samples; a rank with fewer samples draws less), so a checkpoint
// holds each rank's generator state and a resume with the same number of ranks gives each rank
// its own back: dropout after a resume is the uninterrupted run's on every rank.
#include <c10/core/Device.h>

#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace spdlog {
class logger;
}

namespace trainer {

class ProcessGroup;

/// The generator states of every rank, by rank: the CPU's, and `device`'s when it is not the CPU.
struct GeneratorStates {
  std::vector<at::Tensor> cpu, device;
};

/// This process's generator states; with a `group`, every rank's, gathered through its store
/// (a collective: every rank calls it, with the same `name`, new each time).
GeneratorStates gather_generator_states(ProcessGroup* group, const c10::Device& device, const std::string& name);

/// Writes them into a checkpoint: rank 0's as "rng_cpu" / "rng_device" (what a run of one and
/// older checkpoints hold), and with more than one rank every rank's as "rng_cpu_ranks" /
/// "rng_device_ranks" (one row a rank).
void write_generator_states(torch::serialize::OutputArchive& ar, const GeneratorStates& states);

/// Sets this rank's generators from a checkpoint (`file` names it in messages): its own row when
/// the checkpoint was written by as many ranks as the group has, else rank 0's state (said in the
/// log when the ranks then start alike). A device generator missing from the checkpoint (written
/// on the CPU) starts afresh, with a warning.
void restore_generator_states(torch::serialize::InputArchive& ar, const std::string& file, ProcessGroup* group,
                              const c10::Device& device, spdlog::logger& log);

}  // namespace trainer
