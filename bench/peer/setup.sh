#!/usr/bin/env bash
# Installs what the peer benchmark's Python loop needs and trainer itself does not: Debian's
# python3-torch (the same LibTorch 1.13 that trainer links) and python3-numpy. Idempotent.
# Usage: bench/peer/setup.sh   (as root, or with sudo available)
set -euo pipefail

packages=(python3-torch python3-numpy)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "peer setup: ${packages[*]} present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "peer setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
