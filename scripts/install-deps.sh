#!/usr/bin/env bash
# Installs every Debian package trainer needs. Idempotent: does nothing when all are present.
# Usage: scripts/install-deps.sh   (as root, or with sudo available)
set -euo pipefail

# One list, shared with scripts/gpu-bundle.sh: scripts/deps.list (its first column).
mapfile -t packages < <(awk '!/^#/ && NF { print $1 }' "$(dirname "$0")/deps.list")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
