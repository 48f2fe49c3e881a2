#include "trainer/precision.h"

#include <fmt/format.h>
#include <fstream>
#include <sstream>

#include "trainer/error.h"
#include "util/torch_compat.h"

#ifdef TRAINER_WITH_CUDA
#include "memory/backend.h"
#endif

namespace trainer {

bool AutocastState::enabled(c10::DeviceType type) const {
  if (type == c10::kCPU) return cpu_enabled;
  if (type == c10::kCUDA) return cuda_enabled;
  return false;
}

c10::ScalarType AutocastState::dtype(c10::DeviceType type) const { return type == c10::kCUDA ? cuda_dtype : cpu_dtype; }

AutocastState autocast_state() {
  AutocastState s;
  s.cpu_enabled = compat::autocast_enabled(c10::kCPU);
  s.cpu_dtype = compat::autocast_dtype(c10::kCPU);
  s.cuda_enabled = compat::autocast_enabled(c10::kCUDA);
  s.cuda_dtype = compat::autocast_dtype(c10::kCUDA);
  return s;
}

namespace {

void apply(const AutocastState& s) {
  compat::set_autocast_enabled(c10::kCPU, s.cpu_enabled);
  compat::set_autocast_dtype(c10::kCPU, s.cpu_dtype);
  compat::set_autocast_enabled(c10::kCUDA, s.cuda_enabled);
  compat::set_autocast_dtype(c10::kCUDA, s.cuda_dtype);
}

}  // namespace

AutocastGuard::AutocastGuard(c10::DeviceType type, c10::ScalarType dtype, bool enabled) : previous_(autocast_state()) {
  TRAINER_CHECK(type == c10::kCPU || type == c10::kCUDA, "autocast is for CPU and CUDA tensors, not ",
                c10::DeviceTypeName(type));
  AutocastState next = previous_;
  if (type == c10::kCPU) {
    next.cpu_enabled = enabled;
    next.cpu_dtype = dtype;
  } else {
    next.cuda_enabled = enabled;
    next.cuda_dtype = dtype;
  }
  apply(next);
  at::autocast::increment_nesting();
}

AutocastGuard::AutocastGuard(const AutocastState& s) : previous_(autocast_state()) {
  apply(s);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // As torch.autocast.__exit__: the casts cached for the region (weights cast once per forward)
  // are dropped when the outermost region ends, then the previous settings come back.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  apply(previous_);
}

CpuFeatures parse_cpuinfo(const std::string& text) {
  CpuFeatures f;
  std::istringstream in(text);
  bool have_model = false, have_flags = false;
  for (std::string line; std::getline(in, line) && !(have_model && have_flags);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    std::string value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.erase(0, 1);
    if (key == "model name" && !have_model) {
      f.model = value;
      have_model = true;
    } else if (key == "flags" && !have_flags) {
      have_flags = true;
      std::istringstream words(value);
      for (std::string w; words >> w;) {
        if (w == "avx2") f.avx2 = true;
        if (w == "avx512f") f.avx512f = true;
        if (w == "avx512_bf16") f.avx512_bf16 = true;
        if (w == "amx_bf16") f.amx_bf16 = true;
        if (w == "amx_tile") f.amx_tile = true;
      }
    }
  }
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    std::ifstream in("/proc/cpuinfo");
    std::ostringstream text;
    text << in.rdbuf();
    return parse_cpuinfo(text.str());
  }();
  return features;
}

int cuda_compute_capability(int index) {
#ifdef TRAINER_WITH_CUDA
  return detail::cuda_compute_capability(index);
#else
  (void)index;
  return 0;
#endif
}

bool native_bf16(const c10::Device& device, std::string* why) {
  std::string evidence;
  bool native = false;
  if (device.is_cpu()) {
    const CpuFeatures& f = cpu_features();
    native = f.amx_bf16 || f.avx512_bf16;
    const std::string cpu = f.model.empty() ? "this CPU" : f.model;
    evidence = f.amx_bf16      ? "AMX-BF16 in " + cpu
               : f.avx512_bf16 ? "AVX512-BF16 in " + cpu
                               : "no AVX512-BF16 or AMX-BF16 in " + cpu;
  } else if (device.is_cuda()) {
    const int cc = cuda_compute_capability(device.has_index() ? device.index() : 0);
    native = cc >= 80;
    evidence = cc == 0 ? "compute capability unknown (no CUDA in this build, or no such GPU)"
                       : fmt::format("compute capability {}.{}", cc / 10, cc % 10);
  } else {
    evidence = "no bfloat16 detection for " + device.str();
  }
  if (why) *why = evidence;
  return native;
}

}  // namespace trainer
