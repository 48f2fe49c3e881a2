#!/usr/bin/env bash
# runtime.num_threads side by side on the main recipe (recipes/fashion_mnist.toml): the old
# default (every core: runtime.num_threads = nproc) against the new one (0: the cores other work
# leaves free, chosen at the start and at each epoch), on an idle machine and under load, each
# pair run back to back. Prints one table line per load: samples/s of each (train/samples_per_s
# of the run's windows, their mean) and the threads the new default chose.
#
#   bash scripts/threads-bench.sh                        # 300 steps, loads idle, yes1, yesall, trainer
#   STEPS=30 LOADS="idle yes1" bash scripts/threads-bench.sh   # a quick check that it runs
#   REPEATS=3 bash scripts/threads-bench.sh              # each pair three times, interleaved
#
# Loads: idle (nothing else), yes1 (one `yes > /dev/null` busy on one core), yesall (one per
# core), trainer (a second trainer on the same recipe with every core, the old default, running
# throughout). Needs the build (make build) and the data (scripts/install-deps.sh). Run it on a
# machine nothing else uses: the loads are the only other work its figures may see.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TRAINER=${TRAINER:-$BUILD/core/cli/trainer}
STEPS=${STEPS:-300}
REPEATS=${REPEATS:-1}
LOADS=${LOADS:-idle yes1 yesall trainer}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/threads-bench.XXXXXX")}
CORES=$(nproc)
[ -x "$TRAINER" ] || { echo "threads-bench: no $TRAINER; build first (make build)" >&2; exit 2; }
export TRAINER_CONFIG_PATH=${TRAINER_CONFIG_PATH:-$PWD/configs}

LOAD_PIDS=()
stop_load() {
  for p in "${LOAD_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${LOAD_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  LOAD_PIDS=()
}
trap stop_load EXIT

# Starts the other work of load $1.
start_load() {
  case "$1" in
    idle) ;;
    yes1) yes >/dev/null & LOAD_PIDS+=($!) ;;
    yesall) for _ in $(seq "$CORES"); do yes >/dev/null & LOAD_PIDS+=($!); done ;;
    trainer)
      "$TRAINER" --recipe recipes/fashion_mnist.toml --run-dir "$OUT/load-trainer" training.epochs=1000 \
        eval.every_epochs=0 eval.at_end=false checkpoint.every_epochs=0 checkpoint.at_end=false \
        "runtime.num_threads=$CORES" --log-level error >/dev/null 2>&1 &
      LOAD_PIDS+=($!)
      sleep 5  # past its data loading, into its steps
      ;;
    *) echo "threads-bench: unknown load '$1' (idle, yes1, yesall, trainer)" >&2; exit 2 ;;
  esac
  sleep 1
}

# One run of $STEPS steps with runtime.num_threads=$2 into $OUT/$1; prints its mean samples/s.
run() {
  rm -rf "${OUT:?}/$1"
  "$TRAINER" --recipe recipes/fashion_mnist.toml --run-dir "$OUT/$1" "training.max_steps=$STEPS" \
    training.log_every=50 eval.every_epochs=0 eval.at_end=false checkpoint.every_epochs=0 checkpoint.at_end=false \
    'plugins.load=["mixed_precision"]' "runtime.num_threads=$2" --log-level info >/dev/null 2>&1 ||
    { echo "threads-bench: the run in $OUT/$1 failed" >&2; exit 3; }
  awk -F'"value":' '/"name":"train\/samples_per_s"/ { split($2, v, ","); s += v[1]; n++ } END { printf "%.0f", n ? s / n : 0 }' \
    "$OUT/$1/metrics.jsonl"
}

echo "machine: $CORES cores; $STEPS steps of recipes/fashion_mnist.toml per run; runs in $OUT"
printf '%-8s | %-28s | %-28s | %s\n' load "old default ($CORES threads)" "new default (0)" "threads chosen"
for load in $LOADS; do
  start_load "$load"
  for i in $(seq "$REPEATS"); do
    # The order alternates, so that a drift of the machine does not favour one side.
    if [ $((i % 2)) -eq 1 ]; then
      old=$(run "$load-old-$i" "$CORES"); new=$(run "$load-new-$i" 0)
    else
      new=$(run "$load-new-$i" 0); old=$(run "$load-old-$i" "$CORES")
    fi
    chosen=$(grep -o 'runtime.num_threads = 0: [0-9]* threads\? ([^)]*)' "$OUT/$load-new-$i/trainer.log" |
      sed 's/runtime.num_threads = 0: //' | paste -sd ';' -)
    printf '%-8s | %-28s | %-28s | %s\n' "$load" "$old samples/s" "$new samples/s" "$chosen"
  done
  stop_load
done
