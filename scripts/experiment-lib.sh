# Sourced by the experiment scripts (scripts/*-experiment.sh) after they set EXPERIMENT (their
# name, for messages) and DEFAULT_OUT. Takes TRAINER and OUT from the caller's directory (the
# defaults from the repository's), moves to the repository root, checks the binary, and defines
# run().
# shellcheck shell=bash
[ -n "${TRAINER:-}" ] && TRAINER=$(realpath -m "$TRAINER")
[ -n "${OUT:-}" ] && OUT=$(realpath -m "$OUT")
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
TRAINER=${TRAINER:-build/core/cli/trainer}
OUT=${OUT:-$DEFAULT_OUT}
case "$OUT" in *'"'* | *'\'*) echo "$EXPERIMENT: OUT may not hold \" or \\ (it goes into a TOML string)" >&2; exit 2 ;; esac
[ -x "$TRAINER" ] || { echo "$EXPERIMENT: $TRAINER not found; build first (make build)" >&2; exit 2; }

run() {  # run DIR RECIPE [overrides...]: a fresh run directory each time
  local dir=$OUT/$1 recipe=$2
  shift 2
  rm -rf "$dir"
  echo "== $recipe -> $dir $*" >&2
  "$TRAINER" --recipe "$recipe" --run-dir "$dir" --log-level info "$@" >/dev/null 2>"$dir.stderr" ||
    { echo "$EXPERIMENT: $recipe failed; see $dir/trainer.log" >&2; tail -5 "$dir.stderr" >&2; exit 1; }
  rm -f "$dir.stderr"
}
