#!/usr/bin/env bash
# Fuzzes trainer's parsers with libFuzzer, under AddressSanitizer and UndefinedBehaviorSanitizer.
# Builds the `fuzz` CMake preset (clang; build-fuzz/) and runs one target, tests/fuzz/<NAME>_fuzz.cpp:
#   recipe      the recipe and override parser (the default)
#   torch_save  the torch.save reader behind model.weights
#   study_journal  a study's journal (study.jsonl) as `trainer sweep` resumes from it
#   report      `trainer report`'s reading of a run directory (metrics.jsonl, status.json, trainer.log)
#   mlflow_journal  a run's MLflow journal as `trainer mlflow sync` replays it (into a file store)
#   tokenizer   a tokenizer.json and the text it encodes (text/tokenizer.h)
#   sentencepiece  a SentencePiece model with its tokenizer_config.json, and the texts they encode
# It starts from the target's committed corpus (tests/fuzz/corpus for recipe,
# tests/fuzz/corpus_<NAME> for the others), writes new inputs to build-fuzz/corpus
# (build-fuzz/corpus_<NAME>) and a crashing input to build-fuzz/artifacts/. Exits non-zero on a
# finding.
#   scripts/fuzz.sh [--target NAME] [--seconds N] [libFuzzer flags...]      (default: 60 seconds)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
target=recipe
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    *) break ;;
  esac
done
# The recipe target's corpus predates the others, which are named after their target.
case "$target" in
  recipe) seeds=tests/fuzz/corpus; corpus=build-fuzz/corpus ;;
  *) seeds=tests/fuzz/corpus_$target; corpus=build-fuzz/corpus_$target ;;
esac
if [ ! -f "tests/fuzz/${target}_fuzz.cpp" ] || [ ! -d "$seeds" ]; then
  echo "scripts/fuzz.sh: no fuzz target '$target' (tests/fuzz/<target>_fuzz.cpp and its corpus $seeds)" >&2
  exit 2
fi
bash scripts/install-deps.sh >/dev/null
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "${target}_fuzz"
mkdir -p "$corpus" build-fuzz/artifacts
export TRAINER_CONFIG_PATH="$PWD/configs"  # groups such as model/mlp resolve
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
exec "build-fuzz/tests/fuzz/${target}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
  -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 "$@" "$corpus" "$seeds"
