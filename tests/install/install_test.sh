#!/usr/bin/env bash
# Installs trainer into a temporary prefix, builds the three example plugins of
# docs/examples (hello: stops on an eval metric; grad_norm: logs the unclipped gradient norm
# and keeps state across a resume; components: registers a dataset, a model and a task) out of
# tree with find_package(trainer), and runs the installed trainer with them loaded; the
# installed trainer searches installed paths only.
# Usage: install_test.sh <source dir> <build dir>
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The example plugins build with the flags trainer was built with (its cache: line tables only,
# 60 % of the compile time of -g).
example_build=(-DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$(sed -n 's/^CMAKE_CXX_FLAGS_RELWITHDEBINFO:STRING=//p' "$build/CMakeCache.txt")")

cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/docs/examples/hello_plugin" -B "$work/hello" -DCMAKE_PREFIX_PATH="$work/prefix" \
  "${example_build[@]}" >/dev/null
cmake --build "$work/hello" -j2 >/dev/null
test -f "$work/hello/libtrainer_plugin_hello.so"
cmake -S "$src/docs/examples/grad_norm_plugin" -B "$work/grad_norm" -DCMAKE_PREFIX_PATH="$work/prefix" \
  "${example_build[@]}" >/dev/null
cmake --build "$work/grad_norm" -j2 >/dev/null
test -f "$work/grad_norm/libtrainer_plugin_grad_norm.so"

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
grep -q '"stopped_by":"hello","reason":"target accuracy reached"' "$work/run/status.json"
# Captured first: `| grep -q` would close the pipe early and, under pipefail, fail on SIGPIPE.
plugins=$(env -u TRAINER_PLUGIN_PATH "$work/prefix/bin/trainer" plugins --plugin-dir "$work/hello")
grep -q "^hello 1.0.0" <<<"$plugins"
grep -q "^device_select " <<<"$plugins"
# An installed trainer searches installed paths only, never the build tree it came from.
if grep -q "$build/plugins" <<<"$plugins"; then
  echo "installed trainer lists the build tree's plugins:"; echo "$plugins"; exit 1
fi
grep -q "$work/prefix/lib/trainer/plugins" <<<"$plugins"

# The stateful plugin: stop after 3 steps, resume, and its state comes back.
cat >"$work/grad.toml" <<TOML
# Install test: grad_norm across a resume.
# Run: trainer --recipe grad.toml
defaults = ["model/mlp", "dataset/synthetic", "optim/sgd"]
[training]
epochs = 2
batch_size = 64
grad_clip_norm = 1.0
[metrics]
console = false
[plugins]
load = ["grad_norm"]
path = ["$work/grad_norm"]
TOML
"$work/prefix/bin/trainer" --recipe "$work/grad.toml" --run-dir "$work/grad1" training.max_steps=3 >/dev/null 2>&1
grep -q '"stopped_by":"training.max_steps"' "$work/grad1/status.json"
grep -q "grad_norm/unclipped" "$work/grad1/metrics.jsonl"
out=$("$work/prefix/bin/trainer" --recipe "$work/grad.toml" --run-dir "$work/grad2" --resume "$work/grad1" 2>&1)
grep -q "grad_norm: restored mean [0-9.e+-]* over 3 steps" <<<"$out" || { echo "$out"; exit 1; }
grep -q '"status":"FINISHED"' "$work/grad2/status.json"
# A dataset, a model (its blocks checkpointed by grad_checkpoint) and a task of a plugin.
cmake -S "$src/docs/examples/components_plugin" -B "$work/components" -DCMAKE_PREFIX_PATH="$work/prefix" \
  "${example_build[@]}" >/dev/null
cmake --build "$work/components" -j2 >/dev/null
cat >"$work/components.toml" <<TOML
# Install test: a plugin's own dataset, model and loss.
# Run: trainer --recipe components.toml
defaults = ["optim/adamw"]
[dataset]
name = "spirals"
noise = 0.05
[model]
name = "resmlp"
depth = 3
[task]
name = "focal"
gamma = 2.0
[training]
epochs = 20
batch_size = 50
[optim]
lr = 0.01
[metrics]
console = false
[plugins]
load = ["components", "grad_checkpoint"]
path = ["$work/components"]
TOML
out=$("$work/prefix/bin/trainer" --recipe "$work/components.toml" --run-dir "$work/comp" 2>&1) || { echo "$out"; exit 1; }
grep -q "grad_checkpoint: 3 of 3 blocks checkpointed" <<<"$out" || { echo "$out"; exit 1; }
grep -q '"status":"FINISHED"' "$work/comp/status.json"
# The spirals are learnt: the last evaluation's accuracy is above 0.9.
acc=$(grep '"name":"eval/accuracy"' "$work/comp/metrics.jsonl" | tail -1 | sed 's/.*"value":\([0-9.e+-]*\).*/\1/')
awk -v a="$acc" 'BEGIN { exit !(a > 0.9) }' || { echo "spirals eval/accuracy $acc, expected > 0.9"; exit 1; }
# Their keys are validated: a typo is refused with exit code 2 and a suggestion.
set +e
bad=$("$work/prefix/bin/trainer" --recipe "$work/components.toml" model.dept=3 --run-dir "$work/bad" 2>&1)
code=$?
set -e
[ "$code" -eq 2 ] || { echo "a typo in a plugin model's key: exit $code"; echo "$bad"; exit 1; }
grep -q "depth" <<<"$bad" || { echo "$bad"; exit 1; }
# `trainer plugins` lists what the plugin registers, with the keys.
plugins=$(env -u TRAINER_PLUGIN_PATH "$work/prefix/bin/trainer" plugins --plugin-dir "$work/components")
grep -q "registers dataset 'spirals'" <<<"$plugins" || { echo "$plugins"; exit 1; }
grep -q "registers model 'resmlp'" <<<"$plugins" || { echo "$plugins"; exit 1; }
grep -q "registers task 'focal'" <<<"$plugins" || { echo "$plugins"; exit 1; }
grep -q "    gamma (" <<<"$plugins" || { echo "$plugins"; exit 1; }
echo "install test: OK"
