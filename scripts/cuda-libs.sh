# shellcheck shell=bash
# Sourced by scripts/build-cuda.sh and scripts/gpu-check.sh: where a pip torch wheel's CUDA
# libraries are, and the linker flags that make executables link against them.

# wheel_cuda_lib_dirs TORCH_DIR: the folders of the wheel's CUDA libraries (cuBLAS, cuDNN,
# NCCL, ...: site-packages/nvidia/*/lib beside TORCH_DIR), colon-separated, each followed by ':'.
wheel_cuda_lib_dirs() {
  find -L "$(dirname "$1")" -path '*/nvidia/*' -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':'
}

# rpath_link_flags DIRS: -Wl,-rpath-link for each folder of the colon-separated DIRS, so that
# what the linked libraries need in turn is found there (before an older CUDA toolkit's in
# /usr/local/cuda, which CMake's CUDA targets add).
rpath_link_flags() {
  local flags="" d dirs
  IFS=: read -ra dirs <<<"$1"
  for d in "${dirs[@]}"; do [ -n "$d" ] && flags+=" -Wl,-rpath-link,$d"; done
  printf '%s' "$flags"
}
