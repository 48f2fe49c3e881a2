#!/usr/bin/env bash
# The text experiment of docs/text-models.md: on the Debian package descriptions
# (scripts/apt_corpus.py), pre-trains the small BERT-layout encoder with masked language
# modelling (recipes/text_pretrain.toml), then learns the package sections with it by linear
# probe, LoRA (recipes/lora_bert.toml) and full fine-tuning, and from scratch
# (recipes/text_classification.toml) as the baseline; prints the table. About 28 minutes on
# 2 cores.
#
#   bash scripts/text-experiment.sh             # everything, into runs/text/
#   KEEP_PRETRAINED=1 bash scripts/text-experiment.sh   # reuse a finished pre-training run
#
# Needs the build (make build) and data/apt (/usr/bin/python3 scripts/apt_corpus.py data/apt).
set -euo pipefail
EXPERIMENT=text-experiment
DEFAULT_OUT=runs/text
# shellcheck source=scripts/experiment-lib.sh
source "$(dirname "$0")/experiment-lib.sh"
[ -f data/apt/train.csv ] || { echo "text-experiment: no data/apt; run /usr/bin/python3 scripts/apt_corpus.py data/apt" >&2; exit 2; }

mkdir -p "$OUT"
if [ -z "${KEEP_PRETRAINED:-}" ] || ! grep -q '"status":"FINISHED"' "$OUT/pretrain/status.json" 2>/dev/null; then
  run pretrain recipes/text_pretrain.toml 'plugins.load=["console","memory_log"]'
fi
encoder="model.path=\"$OUT/pretrain/hf_model\""
run scratch recipes/text_classification.toml 'plugins.load=["console","memory_log"]'
run probe recipes/lora_bert.toml "$encoder" 'plugins.load=["console","memory_log","linear_probe"]' optim.lr=0.005
run lora recipes/lora_bert.toml "$encoder" 'plugins.load=["console","memory_log","lora"]'
run finetune recipes/lora_bert.toml "$encoder" 'plugins.load=["console","memory_log"]' optim.lr=0.0005 \
  optim.weight_decay=0.01
python3 scripts/text_table.py "$OUT"
