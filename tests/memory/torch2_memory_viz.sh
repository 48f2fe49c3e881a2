#!/bin/bash
# PyTorch 2.x's memory viewer functions (torch/cuda/_memory_viz.py: segsum, trace, segments,
# memory, trace_plot, segment_plot), taken from PyPI's torch wheel without installing it: the
# module imports nothing but Python's standard library, so the test loads it by path beside
# Debian's torch 1.13. The wheel (about 540 MB) is downloaded once into a temporary directory
# and removed; the one file is kept in DIR and reused while it is that version's.
#
# Usage: tests/memory/torch2_memory_viz.sh DIR
set -euo pipefail
version=2.15.0
dir=$1
if [ -f "$dir/_memory_viz.py" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$version" ]; then
  echo "torch $version _memory_viz.py: $dir (cached)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# pip from a throwaway virtual environment (python3-venv), whatever the system Python has.
/usr/bin/python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" download --quiet --disable-pip-version-check --no-cache-dir --no-deps --only-binary=:all: \
  --python-version 3.11 --platform manylinux_2_28_x86_64 "torch==$version" -d "$tmp"
wheel=$(ls "$tmp"/torch-"$version"-*.whl)
mkdir -p "$dir"
/usr/bin/python3 - "$wheel" "$dir" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read("torch/cuda/_memory_viz.py")
with open(sys.argv[2] + "/_memory_viz.py", "wb") as f:
    f.write(data)
PY
echo "$version" >"$dir/VERSION"
echo "torch $version _memory_viz.py: $dir"
