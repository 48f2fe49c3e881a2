#!/usr/bin/env bash
# Installs trainer into a temporary prefix, builds docs/examples/hello_plugin out of tree
# with find_package(trainer), and runs the installed trainer with that plugin loaded.
# Usage: install_test.sh <source dir> <build dir>
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/docs/examples/hello_plugin" -B "$work/hello" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$work/hello" -j2 >/dev/null
test -f "$work/hello/libtrainer_plugin_hello.so"

cat >"$work/recipe.toml" <<TOML
# Install test.
# Run: trainer --recipe recipe.toml
defaults = ["model/mlp", "dataset/synthetic", "optim/sgd"]
[training]
epochs = 3
batch_size = 64
[metrics]
console = false
[plugins]
load = ["hello"]
path = ["$work/hello"]
[plugins.hello]
greeting = "installed and loaded"
stop_at_accuracy = 0.01
TOML

out=$("$work/prefix/bin/trainer" --recipe "$work/recipe.toml" --run-dir "$work/run" 2>&1)
echo "$out"
grep -q "hello: installed and loaded" <<<"$out"
grep -q "hello: target accuracy reached" <<<"$out"
grep -q "hello/best_accuracy" "$work/run/metrics.jsonl"
# Captured first: `| grep -q` would close the pipe early and, under pipefail, fail on SIGPIPE.
plugins=$("$work/prefix/bin/trainer" plugins --plugin-dir "$work/hello")
grep -q "^hello 1.0.0" <<<"$plugins"
grep -q "^device_select " <<<"$plugins"
echo "install test: OK"
