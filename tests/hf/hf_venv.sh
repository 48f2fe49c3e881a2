#!/bin/bash
# A virtual environment with Hugging Face's Python libraries, as users have them: transformers
# (the last release that works with Debian's torch 1.13) with the tokenizers and safetensors it
# brings, over Debian's python3-torch (--system-site-packages). Kept in the build directory and
# reused while it holds that version.
#
# Usage: tests/hf/hf_venv.sh VENV_DIR
set -euo pipefail
version=4.39.3
venv=$1
if [ -x "$venv/bin/python" ] &&
  "$venv/bin/python" -c "import sys, transformers, safetensors, tokenizers; sys.exit(transformers.__version__ != '$version')" 2>/dev/null; then
  echo "transformers $version: $venv (cached)"
  exit 0
fi
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "transformers==$version"
"$venv/bin/python" -c "import torch, transformers, safetensors, tokenizers
print('transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'safetensors',
      safetensors.__version__, 'torch', torch.__version__)"
