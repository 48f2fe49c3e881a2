#!/usr/bin/env bash
# Checks that every C++ file of the repository is formatted by its .clang-format (the check CI
# runs as the test format.clang_format): lists the files that are not, and how to fix them.
# Usage: scripts/check-format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-clang-format}
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
  printf 'not formatted by .clang-format (%s):\n' "$("$fmt" --version)" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "fix: scripts/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
