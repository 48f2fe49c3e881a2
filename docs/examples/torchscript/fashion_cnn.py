#!/usr/bin/python3
"""A model written in Python for trainer's model "torchscript" (docs/models-from-python.md).

The same network as trainer's built-in `cnn` (configs/model/cnn.toml): two stages of 3x3 conv,
BatchNorm, ReLU and 2x2 max-pool, then a hidden layer of 128, dropout 0.25 and the head.
Scripted and saved for recipes/torchscript_fashion_mnist.toml.

Usage: /usr/bin/python3 docs/examples/torchscript/fashion_cnn.py [OUT]   (default build/fashion_cnn.pt)
"""
import sys

import torch
from torch import nn


class FashionCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(
            nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, classes))

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "build/fashion_cnn.pt"
    torch.manual_seed(0)
    torch.jit.script(FashionCNN()).save(out)
    print(f"saved {out}")
