#!/usr/bin/env bash
# trainer sweep against Optuna (bench/sweep/optuna_compare.py): installs optuna from PyPI into
# build/bench/optuna-venv the first time, then runs both studies and prints the table that
# docs/benchmarks.md shows. Needs the build (make test or cmake --build build).
#   bench/sweep/optuna_compare.sh [--trials 20] [--limit 20000]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$root/build/bench/optuna-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import optuna" 2>/dev/null; then
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "optuna==5.0.0"
fi
exec "$venv/bin/python" "$root/bench/sweep/optuna_compare.py" "$@"
