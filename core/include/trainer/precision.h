#pragma once
// Mixed precision: the thread's autocast state behind one API for LibTorch 1.13 and 2.x, an
// RAII guard that always restores it, and what the hardware computes natively.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "trainer/export.h"

namespace trainer {

/// The calling thread's autocast settings (autocast state is thread-local in LibTorch).
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16;  ///< what CPU autocast casts to
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::kHalf;  ///< what CUDA autocast casts to

  /// Whether autocast is on for tensors of `type` (CPU or CUDA; false for others).
  bool enabled(c10::DeviceType type) const;
  /// The dtype autocast casts to on `type`.
  c10::ScalarType dtype(c10::DeviceType type) const;
  bool operator==(const AutocastState& o) const {
    return cpu_enabled == o.cpu_enabled && cpu_dtype == o.cpu_dtype && cuda_enabled == o.cuda_enabled &&
           cuda_dtype == o.cuda_dtype;
  }
  bool operator!=(const AutocastState& o) const { return !(*this == o); }
};

/// The calling thread's autocast state now.
TRAINER_API AutocastState autocast_state();

/// Switches autocast on (or off) for one device type for the guard's lifetime, like
/// `with torch.autocast(device_type, dtype, enabled)`: on destruction the previous state comes
/// back, whatever exception unwinds the scope, and the cache of casted weights is cleared
/// when the outermost autocast region ends (as PyTorch does). Not copyable; use on one thread.
class TRAINER_API AutocastGuard {
 public:
  /// `type` is kCPU or kCUDA; `dtype` what matmuls and convolutions run in (CPU: bfloat16;
  /// CUDA: float16 or bfloat16). Throws trainer::Error for another device type.
  AutocastGuard(c10::DeviceType type, c10::ScalarType dtype, bool enabled = true);
  /// Sets the whole state `s` (both device types), e.g. one captured by autocast_state()
  /// during a forward, to recompute that forward in backward under the same settings.
  explicit AutocastGuard(const AutocastState& s);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
};

/// What the CPU of this machine has that matters for precision choices (from the kernel's
/// view of cpuid, /proc/cpuinfo's flags; all false elsewhere).
struct CpuFeatures {
  std::string model;  ///< "AMD EPYC 7B13", "" when unknown
  bool avx2 = false;
  bool avx512f = false;
  bool avx512_bf16 = false;  ///< AVX512-BF16: native bfloat16 dot products
  bool amx_bf16 = false;     ///< AMX tiles with bfloat16
  bool amx_tile = false;
};

/// This machine's CPU features (read once, cached).
TRAINER_API const CpuFeatures& cpu_features();
/// The features in a /proc/cpuinfo text (`model name` and `flags` of its first processor).
TRAINER_API CpuFeatures parse_cpuinfo(const std::string& text);

/// Whether `device` computes in bfloat16 natively (a bf16 matmul is as fast as float32 or
/// faster): a CPU with AVX512-BF16 or AMX-BF16, a CUDA GPU of compute capability 8.0 or more.
/// Without it bfloat16 is emulated (measured 35x slower than float32 for a 1024^3 matmul on
/// an AVX2-only CPU). `why` receives the evidence either way ("AMX-BF16", "compute capability
/// 7.5", "no AVX512-BF16 or AMX-BF16 in AMD EPYC 7B13").
TRAINER_API bool native_bf16(const c10::Device& device, std::string* why = nullptr);

/// The compute capability of CUDA device `index` as major*10+minor (80 for an A100, 90 for an
/// H100); 0 when this build has no CUDA or the device is not there.
TRAINER_API int cuda_compute_capability(int index);

}  // namespace trainer
