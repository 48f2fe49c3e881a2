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
[ -n "${TRAINER:-}" ] && TRAINER=$(realpath -m "$TRAINER")
[ -n "${OUT:-}" ] && OUT=$(realpath -m "$OUT")
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-build/core/cli/trainer}
OUT=${OUT:-runs/text}
case "$OUT" in *'"'* | *'\'*) echo "text-experiment: OUT may not hold \" or \\ (it goes into a TOML string)" >&2; exit 2 ;; esac
[ -x "$TRAINER" ] || { echo "text-experiment: $TRAINER not found; build first (make build)" >&2; exit 2; }
[ -f data/apt/train.csv ] || { echo "text-experiment: no data/apt; run /usr/bin/python3 scripts/apt_corpus.py data/apt" >&2; exit 2; }

run() {  # run DIR RECIPE [overrides...]: a fresh run directory each time
  local dir=$OUT/$1 recipe=$2
  shift 2
  rm -rf "$dir"
  echo "== $recipe -> $dir $*" >&2
  "$TRAINER" --recipe "$recipe" --run-dir "$dir" --log-level info "$@" >/dev/null 2>"$dir.stderr" ||
    { echo "text-experiment: $recipe failed; see $dir/trainer.log" >&2; tail -5 "$dir.stderr" >&2; exit 1; }
  rm -f "$dir.stderr"
}

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
