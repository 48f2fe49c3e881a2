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

#include <ATen/core/Tensor.h>

#include <sstream>
#include <string>
#include <type_traits>

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

}  // namespace trainer::compat
