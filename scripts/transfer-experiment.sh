#!/usr/bin/env bash
# The transfer experiment of docs/transfer-learning.md: pretrains the tiny ViT and ResNet-18 on
# Fashion-MNIST's classes 0-4, adapts each to classes 5-9 from 1,000 labelled images by linear
# probe, LoRA and full fine-tuning (and trains the same recipe from scratch as the baseline),
# then prints the table. About 9 minutes on 2 cores.
#
#   bash scripts/transfer-experiment.sh            # everything, into runs/transfer/
#   MODELS=vit bash scripts/transfer-experiment.sh # one backbone
#   KEEP_PRETRAINED=1 ...                          # reuse finished pretraining runs
#
# Needs the build (make build) and Debian's dataset-fashion-mnist.
set -euo pipefail
# Paths given by the caller are taken from where it runs; the defaults from the repository.
[ -n "${TRAINER:-}" ] && TRAINER=$(realpath -m "$TRAINER")
[ -n "${OUT:-}" ] && OUT=$(realpath -m "$OUT")
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-build/core/cli/trainer}
OUT=${OUT:-runs/transfer}
MODELS=${MODELS:-vit resnet}
case "$OUT" in *'"'* | *'\'*) echo "transfer-experiment: OUT may not hold \" or \\ (it goes into a TOML string)" >&2; exit 2 ;; esac
[ -x "$TRAINER" ] || { echo "transfer-experiment: $TRAINER not found; build first (make build)" >&2; exit 2; }

run() {  # run DIR RECIPE [overrides...]: a fresh run directory each time
  local dir=$OUT/$1 recipe=$2
  shift 2
  rm -rf "$dir"
  echo "== $recipe -> $dir $*" >&2
  "$TRAINER" --recipe "$recipe" --run-dir "$dir" --log-level info "$@" >/dev/null 2>"$dir.stderr" ||
    { echo "transfer-experiment: $recipe failed; see $dir/trainer.log" >&2; tail -5 "$dir.stderr" >&2; exit 1; }
  rm -f "$dir.stderr"
}

mkdir -p "$OUT"
for m in $MODELS; do
  if [ -z "${KEEP_PRETRAINED:-}" ] || ! grep -q '"status":"FINISHED"' "$OUT/pretrain_$m/status.json" 2>/dev/null; then
    run "pretrain_$m" "recipes/fmnist_pretrain_$m.toml"
  fi
  for method in probe lora finetune; do
    run "${method}_$m" "recipes/fmnist_${method}_$m.toml" "model.weights=\"$OUT/pretrain_$m\""
  done
  run "scratch_$m" "recipes/fmnist_finetune_$m.toml" 'model.weights=""'
done
python3 scripts/transfer_table.py "$OUT"
