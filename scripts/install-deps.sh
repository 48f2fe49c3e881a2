#!/usr/bin/env bash
# Installs every Debian package trainer needs. Idempotent: does nothing when all are present.
# Usage: scripts/install-deps.sh   (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake ccache pkg-config git
  libtorch-dev
  libopenblas0-openmp
  libboost1.74-dev libboost-program-options-dev
  libtoml11-dev libspdlog-dev libfmt-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  zlib1g-dev
  libturbojpeg0-dev libpng-dev libmatio-dev  # image datasets: JPEG, PNG, Flowers102's .mat files
  libgloo-dev  # the headers of c10d's Gloo process group (data-parallel runs)
  clang libclang-rt-14-dev
  dataset-fashion-mnist
  python3-torch python3-torchvision  # the tests write torchvision state_dicts with them
  libcurl4-openssl-dev nlohmann-json3-dev  # the mlflow plugin's HTTP client and JSON
  python3-venv  # the MLflow tests install mlflow from PyPI into a venv
  chromium  # the report test renders the HTML page headless
)

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
