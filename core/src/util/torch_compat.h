#pragma once
// The LibTorch 1.13 (Debian) / 2.x (pip wheels, CUDA) API differences trainer meets, in one
// place. Everything else in trainer compiles unchanged against both.
#include <torch/version.h>

// c10::Allocator::allocate() lost its const in LibTorch 2.3 (and copy_data() was added then).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define TRAINER_ALLOCATOR_ALLOCATE_CONST
#else
#define TRAINER_ALLOCATOR_ALLOCATE_CONST const
#endif

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
namespace serialize {
class InputArchive;
}  // namespace serialize
}  // namespace torch

namespace trainer::compat {

/// The key of a parameter in torch::optim::Optimizer::state(): in 1.13 the TensorImpl address
/// printed as a string (c10::guts::to_string, gone in 2.x), in 2.x the address itself.
template <class Optimizer>
auto optimizer_state_key(const Optimizer& opt, const at::Tensor& p) {
  using Key = typename std::decay_t<decltype(opt.state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// Autocast got per-device-type functions in LibTorch 2.4 (set_autocast_enabled(type, on) ...);
// the per-device ones of 1.13 (set_cpu_enabled, set_autocast_cpu_dtype ...) are deprecated there.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define TRAINER_AUTOCAST_PER_DEVICE_TYPE 1
#endif

/// Whether autocast is on for `type` (kCPU or kCUDA) on this thread.
inline bool autocast_enabled(c10::DeviceType type) {
#ifdef TRAINER_AUTOCAST_PER_DEVICE_TYPE
  return at::autocast::is_autocast_enabled(type);
#else
  return type == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}
inline void set_autocast_enabled(c10::DeviceType type, bool on) {
#ifdef TRAINER_AUTOCAST_PER_DEVICE_TYPE
  at::autocast::set_autocast_enabled(type, on);
#else
  if (type == c10::kCPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
#endif
}
/// The dtype autocast casts to on `type`.
inline c10::ScalarType autocast_dtype(c10::DeviceType type) {
#ifdef TRAINER_AUTOCAST_PER_DEVICE_TYPE
  return at::autocast::get_autocast_dtype(type);
#else
  return type == c10::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
#endif
}
inline void set_autocast_dtype(c10::DeviceType type, c10::ScalarType dtype) {
#ifdef TRAINER_AUTOCAST_PER_DEVICE_TYPE
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == c10::kCPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

/// c10d::Store gained a pure virtual clone() in LibTorch 2.x ("a thread safe copy of this store
/// object that points to the same underlying store"). A store of trainer's derives from
/// `StoreWithClone<c10d::Store, Self>` and defines `clone_store()`: it becomes clone() where the
/// base has one. (Templated on the base, so that this header need not include c10d's.)
template <class Store, class Self, class = void>
struct StoreWithClone : Store {
  using Store::Store;
};
template <class Store, class Self>
struct StoreWithClone<Store, Self, std::void_t<decltype(&Store::clone)>> : Store {
  using Store::Store;
  c10::intrusive_ptr<Store> clone() override { return static_cast<Self*>(this)->clone_store(); }
};
/// Fills `archive` with `module` (a tree of attributes, submodules and tensors), as load_from
/// fills it with what torch::jit::load returns; defined in torch_compat.cpp, see there why.
void set_archive_module(torch::serialize::InputArchive& archive, torch::jit::Module module);

}  // namespace trainer::compat
