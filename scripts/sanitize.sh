#!/usr/bin/env bash
# Builds trainer with AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer (the
# `sanitize` CMake preset, in build-sanitize/) and runs the unit and integration tests under
# them. Any finding fails the test that triggered it. LibTorch itself is not instrumented;
# the few allocations of its own it never frees are suppressed in scripts/lsan.supp, each
# with the reason. Extra arguments go to ctest (e.g. -R Resume).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
cmake --preset sanitize >/dev/null
cmake --build --preset sanitize
cd build-sanitize
# install.out_of_tree_plugin builds a plugin against an install without the sanitizer runtime;
# fuzz.* builds and runs its own instrumented build (scripts/fuzz.sh).
ctest --output-on-failure -j2 -L 'unit|integration' -E '^(install|fuzz)\.' "$@"
