#!/usr/bin/env bash
# Fuzzes the recipe and override parser with libFuzzer (tests/fuzz/recipe_fuzz.cpp), under
# AddressSanitizer and UndefinedBehaviorSanitizer. Builds the `fuzz` CMake preset (clang;
# build-fuzz/), starts from the corpus in tests/fuzz/corpus, writes new inputs to
# build-fuzz/corpus and a crashing input to build-fuzz/artifacts/. Exits non-zero on a finding.
#   scripts/fuzz.sh [--seconds N] [libFuzzer flags...]      (default: 60 seconds)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
if [ "${1:-}" = "--seconds" ]; then
  seconds=$2
  shift 2
fi
bash scripts/install-deps.sh >/dev/null
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target recipe_fuzz
mkdir -p build-fuzz/corpus build-fuzz/artifacts
export TRAINER_CONFIG_PATH="$PWD/configs"  # groups such as model/mlp resolve
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
exec build-fuzz/tests/fuzz/recipe_fuzz -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
  -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 "$@" build-fuzz/corpus tests/fuzz/corpus
