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
EXPERIMENT=transfer-experiment
DEFAULT_OUT=runs/transfer
# shellcheck source=scripts/experiment-lib.sh
source "$(dirname "$0")/experiment-lib.sh"
MODELS=${MODELS:-vit resnet}

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
