#!/usr/bin/python3
"""Writes the safetensors files tests/model/safetensors_test.cpp loads, with Hugging Face's
safetensors library (safetensors.torch.save_file, as save_pretrained writes model.safetensors).

  resnet18.pt               torch.save of a torchvision ResNet-18's state_dict (seeded)
  resnet18.safetensors      the same state_dict, float32 (and BatchNorm's int64 counters)
  resnet18_bf16.safetensors, resnet18_f16.safetensors, resnet18_f64.safetensors
                            its floating tensors in bfloat16, float16, float64

Usage: tests/hf/hf_venv.sh VENV; VENV/bin/python tests/model/safetensors_files.py OUT_DIR
"""
import os
import sys

import torch
import torchvision
from safetensors.torch import save_file


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    state = torchvision.models.resnet18(num_classes=10).state_dict()
    with torch.no_grad():
        for name, t in state.items():  # off the defaults (BatchNorm at 1/0), so a misplaced tensor shows
            if t.is_floating_point():
                t.add_(torch.randn_like(t) * 0.1)
    torch.save(state, os.path.join(out, "resnet18.pt"))
    save_file(state, os.path.join(out, "resnet18.safetensors"), metadata={"format": "pt"})
    for suffix, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16), ("f64", torch.float64)):
        converted = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
        save_file(converted, os.path.join(out, f"resnet18_{suffix}.safetensors"), metadata={"format": "pt"})
    print("safetensors_files: wrote", out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
