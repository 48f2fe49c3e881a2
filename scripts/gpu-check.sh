#!/usr/bin/env bash
# Builds trainer on a GPU machine that has CUDA, CMake, ninja, a compiler and a CUDA PyTorch but
# no network and none of Debian's -dev packages, against the LibTorch of its python3 and the
# archive of scripts/gpu-bundle.sh; then runs the checks of docs/gpu.md. From the repository root:
#
#   scripts/gpu-check.sh build [OUT_DIR]   unpack the bundle, configure, build (ninja, every core)
#   scripts/gpu-check.sh run [OUT_DIR]     the `cuda` tests (none may skip), `trainer mem` (NVML),
#                                          then the test suite
#   scripts/gpu-check.sh bench [OUT_DIR]   the benchmarks on cuda:0 (docs/gpu.md)
#   scripts/gpu-check.sh [OUT_DIR]         all three
#   scripts/gpu-check.sh visit [OUT_DIR]   all three for a short visit, most telling first, within
#                                          TRAINER_GPU_DEADLINE seconds (default 540): the targets
#                                          of the `cuda` tests and the benchmarks alone, the `cuda`
#                                          tests, `trainer mem`, the benchmarks; then the rest of
#                                          the build and the suite. What the time did not reach is
#                                          a SKIP line, what it cut off a FAIL line saying so
#   scripts/gpu-check.sh prove [OUT_DIR]   on the CPU machine: build and run, with the files of
#                                          the packages the bundle carries hidden (a mount
#                                          namespace), so that what the bundle lacks fails; the
#                                          GPU checks are marked SKIP
#
# OUT_DIR (default: $OUT when set, else gpu-check-out) receives the logs (build.log, test.log,
# cuda-tests.log, the benchmarks' CSVs and logs), summary.txt (one line per check: PASS, FAIL or
# SKIP, its name and its figure) and figures.json (the machine and the same checks). The exit
# status is non-zero when anything failed. Nothing is written outside the repository, OUT_DIR and
# $TRAINER_GPU_WORK (default /tmp/trainer-gpu: the unpacked prefix, the build).
#
# Settings: TRAINER_GPU_BUNDLE (the archive; default .gpu-bundle/trainer-gpu-bundle.tar.xz),
# TORCH_DIR (a torch package directory; default: the one python3 imports), TRAINER_GPU_DEADLINE
# (seconds every stage must end within; `visit` only unless set), TRAINER_GPU_TARGETS (`build`:
# these targets only, separated by spaces), TRAINER_GPU_BENCH=0 (`visit`: no benchmarks, so that
# the suite gets their time; `new`: only those no GPU has passed yet), TRAINER_GPU_PASSED (files,
# separated by colons, naming tests that passed on a GPU before, one per line: the suite leaves
# them out; a file that is not there is passed over; each run writes the tests that passed to
# OUT_DIR/tests-passed.txt), TRAINER_GPU_CONTINUE (the summary.txt of a call before on this
# machine: what passed there, or was left out there as passed before, is not done again, a bench's
# CSV copied along; a build only while its folder and env.sh are still there, configured from
# this repository folder; the suite also leaves out the tests-passed.txt beside that summary).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
what=all
case "${1:-}" in build | run | bench | visit | prove) what=$1 && shift ;; esac
out=$(realpath -m "${1:-${OUT:-$root/gpu-check-out}}")
work=${TRAINER_GPU_WORK:-/tmp/trainer-gpu}
bundle=${TRAINER_GPU_BUNDLE:-$root/.gpu-bundle/trainer-gpu-bundle.tar.xz}
prefix=$work/prefix
build=$work/build
mkdir -p "$out" "$work"
summary=$out/summary.txt
ignore_system=()
proving=0
deadline=
if [ -n "${TRAINER_GPU_DEADLINE:-}" ] || [ "$what" = visit ]; then
  deadline=$(($(date +%s) + ${TRAINER_GPU_DEADLINE:-540}))
fi

check() {  # check NAME FIGURE STATUS: one line of the summary
  printf '%s %s %s\n' "$([ "$3" -eq 0 ] && echo PASS || echo FAIL)" "$1" "$2" | tee -a "$summary"
}
skip() {  # skip NAME REASON
  printf 'SKIP %s %s\n' "$1" "$2" | tee -a "$summary"
}
before=${TRAINER_GPU_CONTINUE:-}
[ -z "$before" ] || before=$(realpath -m "$before")
if [ -n "$before" ] && { [ "$(dirname "$before")" = "$out" ] || [ "$before" = "$out" ]; }; then
  echo "gpu-check: TRAINER_GPU_CONTINUE=$before is in this call's OUT_DIR, whose summary and lists it rewrites: give the call another OUT_DIR" >&2
  exit 2
fi
if [ -n "$before" ] && [ ! -f "$before" ]; then
  # A machine started afresh has no summary of a call before: everything runs, as in a first call.
  echo "gpu-check: TRAINER_GPU_CONTINUE=$before: no such file; nothing is left out" >&2
fi
passed_before() {  # passed_before NAME: NAME passed in the call before (TRAINER_GPU_CONTINUE), or
  # was left out there as passed in the one before it (skip_passed's line)
  [ -n "$before" ] && [ -f "$before" ] && grep -Eq "^(PASS $1 |SKIP $1 passed in the call before)" "$before"
}
skip_passed() {  # skip_passed NAME [MORE]: a SKIP line for NAME when it passed before (status 0), else status 1
  passed_before "$1" || return 1
  skip "$1" "passed in the call before ($before)${2:-}"
}
left() {  # seconds left before the deadline (a large number without one)
  if [ -n "$deadline" ]; then echo $((deadline - $(date +%s))); else echo 1000000; fi
}
bounded() {  # bounded SECONDS COMMAND...: the command, stopped after SECONDS or at the deadline (status 124)
  local s=$1 l
  shift
  l=$(left)
  [ "$l" -lt "$s" ] && s=$l
  [ "$s" -gt 5 ] || return 124
  timeout --kill-after=10 "$s" "$@"
}
if [ "$what" = prove ]; then
  # The files of every package the bundle carries (scripts/deps.list's `bundle` rows), hidden
  # by empty files and folders mounted over them: headers, CMake and pkg-config files, the
  # libraries to link, the data set (found through TRAINER_DATASETS_DIR). Libraries loaded at
  # run time stay (the system's tools need them); the tests load the bundle's first
  # (LD_LIBRARY_PATH).
  [ "$(id -u)" -eq 0 ] || { echo "gpu-check prove: needs root (a mount namespace)" >&2; exit 2; }
  if [ -z "${TRAINER_GPU_HIDDEN:-}" ]; then
    export TRAINER_GPU_HIDDEN=1
    exec unshare --mount --propagation private bash "$0" prove "$out"
  fi
  empty=$work/empty
  mkdir -p "$empty/dir"
  : >"$empty/file"
  hidden=0
  for p in $(awk '!/^#/ && $2 == "bundle" { print $1 }' scripts/deps.list); do
    while read -r f; do
      case $f in
        /usr/include/* | /usr/lib/* | /usr/share/cmake/* | /usr/share/pkgconfig/* | /usr/share/datasets/*) ;;
        *) continue ;;
      esac
      case $f in /usr/lib/*.so.[0-9]*) continue ;; esac  # run-time libraries stay
      # A mount over a symbolic link lands on what it leads to (a run-time library): links
      # stay, and CMake is told to search no system prefix (below).
      if [ -f "$f" ] && [ ! -L "$f" ]; then
        mount --bind "$empty/file" "$f" 2>/dev/null && hidden=$((hidden + 1))
      fi
    done < <(dpkg -L "$p")
  done
  for d in /usr/include/boost /usr/include/gtest /usr/include/gmock /usr/include/spdlog /usr/include/fmt \
    /usr/include/nlohmann /usr/include/toml /usr/include/gloo /usr/include/benchmark; do
    [ -d "$d" ] && mount --bind "$empty/dir" "$d"
  done
  echo "gpu-check prove: $hidden files of the bundled packages hidden"
  proving=1
  ignore_system=(-DCMAKE_IGNORE_PREFIX_PATH=/usr\;/usr/local -DCMAKE_SYSTEM_IGNORE_PREFIX_PATH=/usr\;/usr/local)
  what=all
fi


# A stage run on its own (run, bench) adds its lines to those of the stages before it.
case $what in all | build | visit) : >"$summary" ;; esac
# The checks assume the caching allocator's default segments (expandable segments would make
# the squeezes of the cuda tests land elsewhere).
unset PYTORCH_CUDA_ALLOC_CONF
failed=0
record() {  # record NAME FIGURE STATUS: check, and remember a failure
  check "$@"
  [ "$3" -eq 0 ] || failed=1
}
finish() {  # figures.json, and the exit status
  python3 "$root/scripts/gpu_figures.py" json "$out"
  exit "$failed"
}

build_stage() {  # build_stage NAME [TARGET...]: unpack, configure and build (every target by default)
  local name=$1 start status=0
  shift
  if [ -f "$work/env.sh" ] && grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$root" "$build/CMakeCache.txt" 2>/dev/null &&
    skip_passed "$name" "; its build is still in $build"; then
    return
  fi
  [ -f "$bundle" ] || { echo "gpu-check: no bundle at $bundle: run scripts/gpu-bundle.sh on a machine with Debian's archive" >&2; exit 2; }
  if [ ! -f "$prefix/.unpacked" ] || [ "$bundle" -nt "$prefix/.unpacked" ]; then
    rm -rf "$prefix"
    mkdir -p "$prefix"
    tar -C "$prefix" -xJf "$bundle"
    touch "$prefix/.unpacked"
  fi
  local torch_dir
  torch_dir=${TORCH_DIR:-$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')}
  [ -f "$torch_dir/share/cmake/Torch/TorchConfig.cmake" ] || {
    echo "gpu-check: no LibTorch CMake package under $torch_dir" >&2
    exit 2
  }
  # The wheel's CUDA libraries (site-packages/nvidia/*/lib) and the bundle's, for linking
  # (-rpath-link: what the libraries linked need in turn) and for running (env.sh).
  # shellcheck source=scripts/cuda-libs.sh
  source "$root/scripts/cuda-libs.sh"
  local libs link_flags
  libs="$(wheel_cuda_lib_dirs "$torch_dir")$prefix/usr/lib/x86_64-linux-gnu:$prefix/usr/lib"
  link_flags=$(rpath_link_flags "$libs")
  cat >"$work/env.sh" <<ENV
# Generated by scripts/gpu-check.sh: the libraries of the bundle and of $torch_dir.
export LD_LIBRARY_PATH="$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PATH="$prefix/usr/bin:\$PATH"
export PKG_CONFIG="$prefix/usr/bin/pkgconf"
export PKG_CONFIG_LIBDIR="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
export TRAINER_DATASETS_DIR="$prefix/usr/share/datasets"
ENV
  # shellcheck disable=SC1091
  source "$work/env.sh"
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # The Python that writes the torchvision fixtures and reads trainer's checkpoints back: the
  # GPU machine's python3 (it has torchvision), Debian's /usr/bin/python3 when proving here.
  local test_python=${TRAINER_TEST_PYTHON:-/usr/bin/python3}
  if [ -z "${TRAINER_TEST_PYTHON:-}" ] && [ "$proving" -eq 0 ] && python3 -c 'import torchvision' 2>/dev/null; then
    test_python=$(command -v python3)
  fi
  local targets=()
  [ $# -eq 0 ] || targets=(--target "$@")
  start=$(date +%s)
  {
    echo "== $name: cmake --build ${targets[*]}"
    bounded 1000000 cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "-DCMAKE_PREFIX_PATH=$torch_dir/share/cmake;$prefix/usr" "-DCMAKE_EXE_LINKER_FLAGS=$link_flags" \
      "-DCMAKE_SHARED_LINKER_FLAGS=$link_flags" "-DTRAINER_TEST_PYTHON=$test_python" "${ignore_system[@]}" &&
      bounded 1000000 cmake --build "$build" -j"$(nproc)" "${targets[@]}"
  } >>"$out/build.log" 2>&1 || status=$?
  local figure="$(($(date +%s) - start))s"
  [ "$status" -ne 124 ] || figure+="_stopped_at_the_deadline"
  record "$name" "$figure" "$status"
  [ "$status" -eq 0 ] || { tail -40 "$out/build.log" >&2; finish; }
  link_check
}

# The first library each program names must be libstdc++: a pip torch's libtorch.so exports a
# copy of libstdc++'s std::filesystem, and a program that names libtorch first calls that copy,
# whose remove_all crashes (CMakeLists.txt links libstdc++ first for this). The first GPU visit
# found programs that named libtorch first, and every test that removes a folder crashed: so
# the build log records the compiler and a link command, and where the order is wrong the
# checks after it run with the system's libstdc++ preloaded (LD_PRELOAD, in env.sh), so that
# the visit still shows the rest.
link_check() {
  local cxx f first bad=()
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
  {
    echo "== the compiler: $cxx ($(readlink -f "$cxx")); CXX=${CXX:-unset}"
    "$cxx" --version | head -1
    echo "== what the compiler driver adds to a link"
    "$cxx" -### -x c++ /dev/null -o /dev/null 2>&1 | grep collect2
    echo "== the link command of core/cli/trainer, and the libraries it names"
    (cd "$build" && ninja -t commands core/cli/trainer 2>/dev/null | tail -1)
    readelf -d "$build/core/cli/trainer" | grep NEEDED
  } >>"$out/build.log" 2>&1 || true
  for f in "$build/core/cli/trainer" "$build"/tests/*_tests; do
    [ -x "$f" ] || continue
    first=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | head -1)
    [ "$first" = libstdc++.so.6 ] || bad+=("$(basename "$f")=${first:-none}")
  done
  if [ ${#bad[@]} -eq 0 ]; then
    check link-order "libstdc++_first_in_every_program" 0
    return
  fi
  local preload
  preload=$("$cxx" -print-file-name=libstdc++.so.6)
  echo "export LD_PRELOAD=\"$preload\"" >>"$work/env.sh"
  record link-order "first_needed:$(IFS=,; echo "${bad[*]}" | cut -c1-300);_the_checks_below_run_with_LD_PRELOAD=$preload" 1
}

cuda_stage() {  # the `cuda` tests, one at a time (they measure the GPU's memory), then trainer mem
  # shellcheck disable=SC1091
  source "$work/env.sh"
  local start status=0 figure
  if passed_before cuda-tests && passed_before trainer-mem; then
    skip_passed cuda-tests
    skip_passed trainer-mem
    return
  fi
  start=$(date +%s)
  bounded 300 ctest --test-dir "$build" --output-on-failure -L '^cuda$' >"$out/cuda-tests.log" 2>&1 || status=$?
  if [ "$proving" -eq 1 ]; then
    # Here the GPU instances skip by design: the figure counts them, the status is ctest's.
    figure=$(python3 "$root/scripts/gpu_figures.py" cuda-tests "$out/cuda-tests.log") || true
    record cuda-tests-cpu-instances "${figure}_in_$(($(date +%s) - start))s" "$status"
    return
  fi
  figure=$(python3 "$root/scripts/gpu_figures.py" cuda-tests "$out/cuda-tests.log") || status=1
  [ "$status" -ne 124 ] || figure+="_stopped_at_the_deadline"
  record cuda-tests "${figure}_in_$(($(date +%s) - start))s" "$status"
  local cli=$build/core/cli/trainer
  status=0
  bounded 60 "$cli" mem --json >"$out/mem.json" 2>"$out/mem.err" || status=$?
  bounded 60 "$cli" mem >"$out/mem.txt" 2>&1 || true
  figure=$(python3 "$root/scripts/gpu_figures.py" mem "$out/mem.json") || status=1
  record trainer-mem "$figure" "$status"
}

suite_stage() {  # the test suite but the `cuda` tests and what the GPU machine lacks
  # shellcheck disable=SC1091
  source "$work/env.sh"
  # Tests that need what a GPU node lacks, left out there (and named in the summary):
  # install.* builds against the system's packages, fuzz.* builds with clang and the system's
  # -dev packages, format.* checks the sources' formatting (clang-format, no GPU path in it);
  # the rest only where their tool is missing.
  local exclude='^install\.|^fuzz\.|^format\.' test_python start status=0 figure
  skip tests:install,fuzz "they build against the system's -dev packages (fuzz: with clang)"
  skip tests:format "the formatting check needs clang-format and no GPU; it runs on the CPU machine"
  test_python=$(sed -n 's/^TRAINER_TEST_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
  if ! "$test_python" -c 'import torchvision' 2>/dev/null; then
    exclude+='|^fixture\.torchvision_files$|^Resnet\.|^Weights\.|^WeightsRun\.|^interop\.'
    skip tests:torchvision "$test_python has no torch and torchvision to write the fixture files"
  fi
  if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    exclude+='|^ReportChromium\.'
    skip tests:chromium "no headless Chromium"
  fi
  if [ -z "${TRAINER_GPU_PYPI:-}" ] && [ "$proving" -eq 0 ]; then
    # The fixtures labelled `pypi` take packages from PyPI (the MLflow server, TensorBoard, Hugging
    # Face's libraries, torch's memory viewer): every test that needs one, directly or through
    # another fixture.
    local pypi=
    if ! ctest --test-dir "$build" --show-only=json-v1 >"$work/tests.json" ||
      ! pypi=$(python3 "$root/scripts/gpu_figures.py" pypi-tests "$work/tests.json"); then
      record tests:pypi "could_not_list_the_tests_that_need_PyPI" 1
      pypi=
    fi
    [ -z "$pypi" ] || exclude+="|$pypi"
    [ -z "$pypi" ] || skip tests:pypi "$(($(echo "$pypi" | tr -cd '|' | wc -c) + 1)) tests need packages from PyPI (MLflow, TensorBoard, Hugging Face's libraries, torch's memory viewer; set TRAINER_GPU_PYPI=1 where PyPI is reachable)"
  fi
  local select=(-LE '^cuda$' -E "$exclude") passed=() f lists=
  # The lists of tests that passed before: those named, and the call before's; one that is not
  # there (a call that did not reach the suite writes none) is passed over.
  IFS=: read -r -a passed <<<"${TRAINER_GPU_PASSED:-}"
  [ -z "$before" ] || passed+=("$(dirname "$before")/tests-passed.txt")
  for f in "${passed[@]}"; do
    [ -n "$f" ] || continue
    if [ -f "$f" ]; then lists+="${lists:+:}$f"; else echo "gpu-check: no list $f: passed over" >&2; fi
  done
  if [ -n "$lists" ]; then
    # Tests that passed on a GPU before (the files' names, one per line): left out, so that a
    # visit reaches the tests no visit has run yet. The others are selected by number (-I): a
    # list of numbers has no size limit, ctest's -E expressions have one. The list leaves out
    # what -LE and -E would, and goes alone: ctest numbers -I among the tests -LE and -E leave.
    local index
    if ! ctest --test-dir "$build" --show-only=json-v1 >"$work/tests-all.json" ||
      ! index=$(python3 "$root/scripts/gpu_figures.py" passed-index "$work/tests-all.json:$lists" \
        "$exclude" '^cuda$'); then
      record tests:passed-before "could_not_read_$lists" 1
      index=
    fi
    if [ "$index" = none ]; then
      skip tests "every test passed on a GPU before ($lists)"
      return
    fi
    if [ -n "$index" ]; then
      select=(-I "$index")
      skip tests:passed-before "the tests named in $lists passed on a GPU before"
    fi
  fi
  start=$(date +%s)
  bounded 1000000 ctest --test-dir "$build" --output-on-failure -j"$(nproc)" "${select[@]}" \
    >"$out/test.log" 2>&1 || status=$?
  # The tests that passed, for TRAINER_GPU_PASSED of a later call.
  python3 "$root/scripts/gpu_figures.py" passed-tests "$out/test.log" >"$out/tests-passed.txt" || true
  # (No such line when ctest was cut off: grep's status must not end the script under pipefail.)
  figure=$( (grep -Eo '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$out/test.log" || true) | tail -1 |
    sed 's/ /_/g')
  if [ "$status" -eq 124 ]; then
    # Cut off: how far it got, from ctest's one line per finished test.
    figure="stopped_at_the_deadline_after_$(grep -c ' Passed ' "$out/test.log" || true)_passed_$(grep -Ec '\*\*\*(Failed|Exception|Timeout)' "$out/test.log" || true)_failed"
  fi
  record tests "${figure}_in_$(($(date +%s) - start))s" "$status"
}

bench_one() {  # bench_one NAME FIGURE_KIND trainer-arguments...: one `trainer bench`, its CSV and figure
  local name=$1 kind=$2 st=0 fig
  shift 2
  if skip_passed "$name"; then
    # Its CSV comes along (estimate-offload reads ladder-mlp-offload's).
    [ ! -f "$(dirname "$before")/$name.csv" ] || cp "$(dirname "$before")/$name.csv" "$out/"
    return
  fi
  if [ "$(left)" -lt 30 ]; then
    skip "$name" "no time left in the visit"
    return
  fi
  bounded 180 "$build/core/cli/trainer" "$@" --csv "$out/$name.csv" >"$out/$name.log" 2>&1 || st=$?
  fig=$(python3 "$root/scripts/gpu_figures.py" "$kind" "$out/$name.csv" 2>&1) || st=1
  [ "$st" -ne 124 ] || fig+="_stopped_at_the_deadline"
  record "$name" "$fig" "$st"
}

bench_stage() {  # the benchmarks on cuda:0 (docs/gpu.md)
  # shellcheck disable=SC1091
  source "$work/env.sh"
  # What no GPU has run yet comes first (the offload rung, memory by category's cost, the ladder),
  # so that a visit cut short still shows it; then what earlier visits measured.
  # The offload rung on a wide MLP (20.0 M parameters: AdamW's moments 153 MiB, half its step's
  # peak), and trainer estimate's offload rung (a GPU's only: its probe runs there) against its peaks.
  local mlp=(--recipe recipes/fashion_mnist.toml model=mlp 'model.hidden=[4096, 4096]' 'plugins.load=["oom_backoff"]'
    runtime.device=cuda:0)
  bench_one ladder-mlp-offload bench bench "${mlp[@]}" --grid "plugins.oom_backoff.start_offload=false,true" \
    --steps 10 --warmup 3
  if skip_passed estimate-offload; then
    :
  elif [ "$(left)" -lt 30 ]; then
    skip estimate-offload "no time left in the visit"
  else
    local est=0 efig
    bounded 180 "$build/core/cli/trainer" estimate "${mlp[@]}" --json >"$out/estimate-offload.json" \
      2>"$out/estimate-offload.log" || est=$?
    efig=$(python3 "$root/scripts/gpu_figures.py" estimate-offload "$out/estimate-offload.json" \
      "$out/ladder-mlp-offload.csv" 2>&1) || { [ "$est" -ne 0 ] || est=1; }
    [ "$est" -ne 124 ] || efig+="_stopped_at_the_deadline"
    record estimate-offload "$efig" "$est"
  fi
  # The same on the ViT: AdamW's moments streamed from host memory at each step, or not.
  bench_one ladder-vit-offload bench bench --recipe recipes/vit_fashion_mnist.toml \
    --grid "plugins.oom_backoff.start_offload=false,true" training.micro_batch_size=128 \
    'plugins.load=["oom_backoff"]' runtime.device=cuda:0 --steps 20 --warmup 3
  # What memory by category costs on CUDA (its trace tracker on every allocation and free): the
  # default recipe without, then with it (the tracker stays attached once a cell attached it).
  bench_one bench-categories bench bench --recipe recipes/fashion_mnist.toml \
    --grid "memory.categories=false,true" runtime.device=cuda:0 --steps 100 --warmup 10
  # The memory ladder's rungs on the ViT, oom_backoff started on them: the micro-batch halved,
  # and blocks checkpointed at micro-batch 8, from where "auto" checkpoints before halving on a
  # GPU (measured on the CPU only so far: docs/benchmarks.md, "The memory ladder").
  bench_one ladder-vit-micro bench bench --recipe recipes/vit_fashion_mnist.toml \
    --grid "training.micro_batch_size=128,32,8,4,2" 'plugins.load=["oom_backoff"]' runtime.device=cuda:0 \
    --steps 20 --warmup 3
  bench_one ladder-vit-checkpoint bench bench --recipe recipes/vit_fashion_mnist.toml \
    --grid "plugins.oom_backoff.start_checkpointed_blocks=0,1,2,4" training.micro_batch_size=8 \
    'plugins.load=["oom_backoff"]' runtime.device=cuda:0 --steps 20 --warmup 3
  if [ "${TRAINER_GPU_BENCH:-1}" = new ]; then
    skip bench:measured-before "TRAINER_GPU_BENCH=new: bench-precision, estimate-vs-measured, bench-vit, bench-vit-checkpointed and peer-trainer-vs-libtorch passed on a GPU before (docs/gpu.md)"
    return
  fi
  # The default recipe's samples/s in fp32 and bf16 (steps after 10 of warm-up).
  bench_one bench-precision bench bench --recipe recipes/fashion_mnist.toml \
    --grid "plugins.mixed_precision.precision=fp32,bf16" runtime.device=cuda:0 --steps 100 --warmup 10
  # trainer estimate's prediction (probes 256, 512, 1024) against the measured peak, at 2048 and
  # 4096 held out.
  bench_one estimate-vs-measured estimate bench --recipe recipes/fashion_mnist.toml \
    --grid "training.micro_batch_size=512,2048,4096" training.batch_size=4096 runtime.device=cuda:0 --steps 5 --warmup 2
  # The ViT recipe with and without activation checkpointing: step time and peak.
  bench_one bench-vit bench bench --recipe recipes/vit_fashion_mnist.toml --grid "training.micro_batch_size=128" \
    runtime.device=cuda:0 --steps 50 --warmup 5
  bench_one bench-vit-checkpointed bench bench --recipe recipes/vit_fashion_mnist.toml \
    --grid "training.micro_batch_size=128" runtime.device=cuda:0 \
    'plugins.load=["console","mixed_precision","grad_checkpoint"]' --steps 50 --warmup 5
  # trainer's step against the hand-written LibTorch loop, same model and data, fp32.
  skip_passed peer-trainer-vs-libtorch && return
  if [ "$(left)" -lt 60 ]; then
    skip peer-trainer-vs-libtorch "no time left in the visit"
    return
  fi
  local status=0 figure
  bounded 240 python3 bench/peer/peer_bench.py --no-build --build-dir "$build" --only trainer,cpp --device cuda:0 \
    --precision fp32 --epochs 1 --repeats 3 --out-dir "$work/peer" --json "$out/peer.json" >"$out/peer.log" 2>&1 ||
    status=$?
  figure=$(python3 "$root/scripts/gpu_figures.py" peer "$out/peer.json" 2>&1) || status=1
  [ "$status" -ne 124 ] || figure+="_stopped_at_the_deadline"
  record peer-trainer-vs-libtorch "$figure" "$status"
}

case $what in
  build)
    # shellcheck disable=SC2086
    build_stage build ${TRAINER_GPU_TARGETS:-}
    finish
    ;;
  run)
    cuda_stage
    suite_stage
    finish
    ;;
  bench)
    bench_stage
    finish
    ;;
  all)
    build_stage build
    cuda_stage
    suite_stage
    if [ "$proving" -eq 1 ]; then
      skip gpu-checks "prove runs on the CPU: the GPU checks run on a GPU only"
      finish
    fi
    bench_stage
    finish
    ;;
  visit)
    # What the `cuda` tests and the benchmarks need, first; the rest of the build and the suite
    # with the time that is left.
    build_stage build-for-cuda-tests cuda_tests trainer peer_loop trainer_plugin_console trainer_plugin_mixed_precision \
      trainer_plugin_grad_checkpoint trainer_plugin_oom_backoff trainer_plugin_device_select trainer_plugin_memory_log
    cuda_stage
    if [ "${TRAINER_GPU_BENCH:-1}" = 0 ]; then
      skip bench "TRAINER_GPU_BENCH=0: the benchmarks' time goes to the suite"
    else
      bench_stage
    fi
    if [ "$(left)" -lt 60 ]; then
      skip build "no time left in the visit"
      skip tests "no time left in the visit"
      finish
    fi
    build_stage build
    if [ "$(left)" -lt 60 ]; then
      skip tests "no time left in the visit"
      finish
    fi
    suite_stage
    finish
    ;;
esac
