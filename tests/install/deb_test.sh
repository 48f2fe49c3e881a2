#!/usr/bin/env bash
# `cpack -G DEB` builds a Debian package of trainer; extracted into a clean prefix (dpkg-deb -x:
# the package's /usr moved elsewhere, which the installed trainer must cope with), its trainer
# runs a shipped recipe with the packaged config groups and plugins, and an out-of-tree plugin
# builds against its CMake package and loads. The package names what it depends on.
# Usage: deb_test.sh <source dir> <build dir>
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The example plugins build with the flags trainer was built with (its cache: line tables only,
# 60 % of the compile time of -g).
example_build=(-DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$(sed -n 's/^CMAKE_CXX_FLAGS_RELWITHDEBINFO:STRING=//p' "$build/CMakeCache.txt")")

# The package's Depends come from dpkg-shlibdeps, which knows only Debian's libraries: a build
# against a LibTorch that no Debian package holds (PyPI's torch wheel, scripts/build-cuda.sh)
# cannot be packaged this way. Skipped there (exit code 77), saying so.
torch_lib=$(ldd "$build/core/libtrainer_core.so" | awk '/libtorch_cpu\.so/ { print $3 }')
if [ -z "$torch_lib" ] || ! dpkg -S "$(readlink -f "$torch_lib")" >/dev/null 2>&1; then
  echo "skipped: LibTorch ($torch_lib) is not from a Debian package, so dpkg-shlibdeps cannot name it"
  exit 77
fi

(cd "$build" && cpack -G DEB -B "$work/pkg" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; exit 1; }
deb=$(ls "$work"/pkg/trainer_*.deb)
info=$(dpkg-deb -I "$deb")
grep -q "^ Package: trainer$" <<<"$info" || { echo "$info"; exit 1; }
# dpkg-shlibdeps found the shared libraries (LibTorch's among them), and the -dev packages are there.
depends=$(sed -n 's/^ Depends: //p' <<<"$info")
for want in libtorch libspdlog-dev libboost1.74-dev libc6; do
  grep -q "$want" <<<"$depends" || { echo "Depends lacks $want: $depends"; exit 1; }
done
contents=$(dpkg-deb -c "$deb")
for f in ./usr/bin/trainer ./usr/lib/libtrainer_core.so ./usr/lib/trainer/plugins/libtrainer_plugin_console.so \
  ./usr/lib/trainer/plugins/libtrainer_plugin_tensorboard.so ./usr/share/trainer/configs/model/cnn.toml \
  ./usr/share/trainer/recipes/fashion_mnist.toml ./usr/include/trainer/plugin.h ./usr/lib/cmake/trainer/trainerConfig.cmake; do
  grep -q " $f\$" <<<"$contents" || grep -q " $f -> " <<<"$contents" || { echo "the package lacks $f"; exit 1; }
done

root="$work/root"
dpkg-deb -x "$deb" "$root"
prefix="$root/usr"
# A shipped recipe, its groups (model/cnn, dataset/fashion_mnist, optim/adamw) from the package.
out=$(env -u TRAINER_CONFIG_PATH -u TRAINER_PLUGIN_PATH "$prefix/bin/trainer" \
  --recipe "$prefix/share/trainer/recipes/fashion_mnist.toml" training.max_steps=3 dataset.limit=512 \
  dataset.eval_limit=256 'plugins.load=["console", "tensorboard"]' --run-dir "$work/run" 2>&1) || { echo "$out"; exit 1; }
grep -q '"status":"FINISHED"' "$work/run/status.json" || { echo "$out"; exit 1; }
grep -q '"name":"eval/accuracy"' "$work/run/metrics.jsonl" || { echo "$out"; exit 1; }
ls "$work/run/tensorboard"/events.out.tfevents.* >/dev/null
plugins=$(env -u TRAINER_PLUGIN_PATH "$prefix/bin/trainer" plugins)
grep -q "$prefix/lib/trainer/plugins" <<<"$plugins" || { echo "$plugins"; exit 1; }
if grep -q "$build" <<<"$plugins"; then echo "the packaged trainer lists the build tree:"; echo "$plugins"; exit 1; fi

# An out-of-tree plugin against the package's CMake package.
cmake -S "$src/docs/examples/hello_plugin" -B "$work/hello" -DCMAKE_PREFIX_PATH="$prefix" \
  "${example_build[@]}" >/dev/null
cmake --build "$work/hello" -j2 >/dev/null
cat >"$work/recipe.toml" <<TOML
# Package test.
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
greeting = "packaged and loaded"
stop_at_accuracy = 0.01
TOML
out=$("$prefix/bin/trainer" --recipe "$work/recipe.toml" --run-dir "$work/hello_run" 2>&1) || { echo "$out"; exit 1; }
grep -q "hello: packaged and loaded" <<<"$out" || { echo "$out"; exit 1; }
echo "deb test: OK ($(du -h "$deb" | cut -f1) $(basename "$deb"))"
