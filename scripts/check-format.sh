#!/usr/bin/env bash
# Checks that every C++ file of the repository is formatted by its .clang-format (the check CI
# runs as the test format.clang_format): lists the files that are not, and how to fix them.
# Usage: scripts/check-format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
# The files are formatted by clang-format 14 (Debian bookworm's); another major version formats
# some constructs differently, so it is named when it disagrees.
fmt=${CLANG_FORMAT:-}
if [[ -z $fmt ]]; then
  fmt=clang-format
  command -v clang-format-14 >/dev/null && fmt=clang-format-14
fi
if ! command -v "$fmt" >/dev/null; then
  echo "check-format: $fmt not found: install it (scripts/install-deps.sh installs Debian's clang-format)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h')
if [[ ${1:-} == --fix ]]; then
  "$fmt" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$fmt" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'not formatted by .clang-format (%s; the files follow clang-format 14):\n' "$("$fmt" --version)" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "fix: scripts/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
