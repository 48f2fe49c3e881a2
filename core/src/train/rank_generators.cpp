#include "train/rank_generators.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <spdlog/spdlog.h>
#include <torch/serialize.h>

#include <mutex>

#include "trainer/distributed.h"
#include "trainer/error.h"

namespace trainer {

namespace {

at::Generator generator_of(const c10::Device& device) {
  return device.is_cpu() ? at::detail::getDefaultCPUGenerator() : at::globalContext().defaultGenerator(device);
}

at::Tensor state_of(const c10::Device& device) {
  at::Generator g = generator_of(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

void set_state(const c10::Device& device, const at::Tensor& state) {
  at::Generator g = generator_of(device);  // a handle sharing the default generator
  std::lock_guard<std::mutex> lock(g.mutex());
  // A tensor of its own: `state` may be a row of the checkpoint's per-rank table, and LibTorch
  // 2.x's set_state reads the storage from its start, ignoring a view's offset (rank 1's row
  // crashed the CPU generator).
  g.set_state(state.to(at::kCPU).clone(at::MemoryFormat::Contiguous));
}

/// Each rank's `state` (a byte tensor), by rank.
std::vector<at::Tensor> gather_states(ProcessGroup& group, const std::string& name, const at::Tensor& state) {
  const at::Tensor bytes = state.contiguous();
  const std::string mine(reinterpret_cast<const char*>(bytes.data_ptr<std::uint8_t>()),
                         static_cast<std::size_t>(bytes.numel()));
  std::vector<at::Tensor> out;
  for (const std::string& s : group.gather(name, mine)) {
    TRAINER_CHECK(s.size() == mine.size(), "generator states of different sizes across the ranks (", s.size(), " and ",
                  mine.size(), " bytes)");
    at::Tensor t = at::empty({static_cast<std::int64_t>(s.size())}, at::kByte);
    std::copy(s.begin(), s.end(), reinterpret_cast<char*>(t.data_ptr<std::uint8_t>()));
    out.push_back(t);
  }
  return out;
}

}  // namespace

GeneratorStates gather_generator_states(ProcessGroup* group, const c10::Device& device, const std::string& name) {
  GeneratorStates out;
  const at::Tensor cpu = state_of(c10::Device(c10::kCPU));
  const at::Tensor dev = device.is_cpu() ? at::Tensor() : state_of(device);
  if (!group) {
    out.cpu = {cpu};
    if (dev.defined()) out.device = {dev};
    return out;
  }
  out.cpu = gather_states(*group, name + "/cpu", cpu);
  if (dev.defined()) out.device = gather_states(*group, name + "/device", dev);
  return out;
}

void write_generator_states(torch::serialize::OutputArchive& ar, const GeneratorStates& states) {
  ar.write("rng_cpu", states.cpu.front());
  if (!states.device.empty()) ar.write("rng_device", states.device.front());
  if (states.cpu.size() > 1) ar.write("rng_cpu_ranks", at::stack(states.cpu));
  if (states.device.size() > 1) ar.write("rng_device_ranks", at::stack(states.device));
}

void restore_generator_states(torch::serialize::InputArchive& ar, const std::string& file, ProcessGroup* group,
                              const c10::Device& device, spdlog::logger& log) {
  const std::int64_t rank = group ? group->rank() : 0, ranks = group ? group->size() : 1;
  // This rank's row of "<key>_ranks" when the checkpoint has one a rank, else `key` (rank 0's).
  const auto read = [&](const std::string& key, at::Tensor& state) {
    at::Tensor rows;
    if (ar.try_read(key + "_ranks", rows)) {
      if (rows.dim() == 2 && rows.size(0) == ranks) {
        state = rows[rank];
        return;
      }
      if (rank == 0) {
        log.info("{} holds the generators of {} ranks, this run has {}: every rank continues from rank 0's", file,
                 rows.dim() == 2 ? rows.size(0) : -1, ranks);
      }
    }
    if (!ar.try_read(key, state)) state = at::Tensor();
  };
  at::Tensor cpu;
  read("rng_cpu", cpu);
  TRAINER_CHECK_T(UsageError, cpu.defined(), "cannot resume from ", file, ": it holds no generator state (rng_cpu)");
  set_state(c10::Device(c10::kCPU), cpu);
  if (device.is_cpu()) return;
  at::Tensor dev;
  read("rng_device", dev);
  if (dev.defined()) {
    set_state(device, dev);
  } else {
    log.warn("{} holds no generator state for {} (written on the CPU): its random stream starts afresh", file,
             device.str());
  }
}

}  // namespace trainer
