#!/usr/bin/env bash
# TensorBoard for the tests: tensorboard==2.20.0 from PyPI in VENV (kept when present), the
# reader of the tensorboard plugin's event files.
#   tensorboard_venv.sh VENV
set -euo pipefail
version=2.20.0
venv=${1:?usage: $0 VENV}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import sys, tensorboard; sys.exit(tensorboard.__version__ != '$version')" 2>/dev/null; then
  echo "tensorboard $version: $venv (cached)"
  exit 0
fi
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "tensorboard==$version"
"$venv/bin/python" -c "import tensorboard; print('tensorboard', tensorboard.__version__, 'installed')"
