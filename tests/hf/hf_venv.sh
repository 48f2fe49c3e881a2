#!/bin/bash
# A virtual environment with Hugging Face's Python libraries, as users have them: transformers
# (the last release that works with Debian's torch 1.13) with the tokenizers and safetensors it
# brings, and sentencepiece (its T5, ALBERT and DeBERTa-v2 tokenizers need it; 0.1.99 segments
# as Debian's libsentencepiece 0.1.97 does, where 0.2 breaks ties between segmentations of equal
# score otherwise, on 6 of the 15,238 lines of the tokenizer corpus), over Debian's
# python3-torch (--system-site-packages). Kept in the build directory and reused while it holds
# those versions.
#
# Usage: tests/hf/hf_venv.sh VENV_DIR
set -euo pipefail
version=4.39.3
sentencepiece=0.1.99
venv=$1
if [ -x "$venv/bin/python" ] &&
  "$venv/bin/python" -c "import sys, transformers, safetensors, tokenizers, sentencepiece
sys.exit(transformers.__version__ != '$version' or sentencepiece.__version__ != '$sentencepiece')" 2>/dev/null; then
  echo "transformers $version, sentencepiece $sentencepiece: $venv (cached)"
  exit 0
fi
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "transformers==$version" "sentencepiece==$sentencepiece"
"$venv/bin/python" -c "import torch, transformers, safetensors, tokenizers, sentencepiece
print('transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'safetensors',
      safetensors.__version__, 'sentencepiece', sentencepiece.__version__, 'torch', torch.__version__)"
