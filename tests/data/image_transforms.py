#!/usr/bin/python3
"""The image transforms of torchvision (Debian's python3-torchvision), with fixed parameters,
on float images, as references for trainer's (tests/data/image_transforms_test.cpp).

Usage: /usr/bin/python3 tests/data/image_transforms.py OUT_DIR

Writes into OUT_DIR:
  image.bin   the input: uint8 [3, 60, 80], raw (noise, grey pixels, pure and saturated colours)
  cases.txt   one case a line: NAME, then the steps applied in order to image / 255 (float32):
                crop TOP LEFT HEIGHT WIDTH SIZE   F.resized_crop(..., [SIZE, SIZE], antialias=True)
                flip                              F.hflip
                brightness F | contrast F | saturation F | hue F    F.adjust_*
                portrait                          the image transposed to [3, 80, 60] first
                resize N                          F.resize(..., N, antialias=True)
                centercrop N                      F.center_crop(..., N)
                normalize                         F.normalize with ImageNet's mean and std
  NAME.bin    the case's result, float32 [3, H, W], raw
  square.png  a 32 x 32 crop of the input, written by torchvision.io.write_png (for a dataset)
"""
import os
import sys

import torch
import torchvision.io
import torchvision.transforms.functional as F

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]

CASES = [
    ("shrink", "crop 5 7 40 50 32"),
    ("enlarge", "crop 10 20 20 16 32"),
    ("flip", "crop 0 0 60 80 24 flip"),
    ("brightness", "crop 5 7 40 50 32 brightness 1.3"),
    ("darker", "crop 5 7 40 50 32 brightness 0.4"),
    ("contrast", "crop 5 7 40 50 32 contrast 0.6"),
    ("more_contrast", "crop 5 7 40 50 32 contrast 1.8"),
    ("saturation", "crop 5 7 40 50 32 saturation 1.7"),
    ("grey", "crop 5 7 40 50 32 saturation 0"),
    ("hue", "crop 5 7 40 50 32 hue 0.2"),
    ("hue_back", "crop 5 7 40 50 32 hue -0.45"),
    ("jitter", "crop 3 9 50 44 32 flip hue -0.1 contrast 1.2 brightness 0.8 saturation 0.5 normalize"),
    ("jitter_other_order", "crop 3 9 50 44 32 flip saturation 0.5 brightness 0.8 contrast 1.2 hue -0.1 normalize"),
    ("eval", "resize 36 centercrop 32 normalize"),
    ("eval_portrait", "portrait resize 36 centercrop 32 normalize"),
    ("eval_odd", "resize 39 centercrop 32 normalize"),  # offsets 3.5 -> 4 (round, not floor), 10
]


def image():
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 256, (3, 60, 80), generator=g, dtype=torch.uint8)
    x[:, :10, :10] = 128                                      # grey: no hue (max == min)
    x[:, 10:20, :10] = torch.tensor([255, 0, 0], dtype=torch.uint8).view(3, 1, 1)   # pure red
    x[:, 20:30, :10] = torch.tensor([0, 255, 255], dtype=torch.uint8).view(3, 1, 1)  # cyan
    x[:, 30:40, :10] = torch.tensor([250, 250, 10], dtype=torch.uint8).view(3, 1, 1)  # r == g max
    x[:, 40:50, :10] = 0                                      # black
    x[:, 50:60, :10] = 255                                    # white
    return x


def run(steps, x):
    tokens = steps.split()
    k = 0
    while k < len(tokens):
        op = tokens[k]
        if op == "crop":
            top, left, h, w, size = (int(v) for v in tokens[k + 1:k + 6])
            x = F.resized_crop(x, top, left, h, w, [size, size], antialias=True)
            k += 6
            continue
        if op in ("brightness", "contrast", "saturation", "hue"):
            x = getattr(F, "adjust_" + op)(x, float(tokens[k + 1]))
            k += 2
            continue
        if op == "resize":
            x = F.resize(x, int(tokens[k + 1]), antialias=True)
            k += 2
            continue
        if op == "centercrop":
            x = F.center_crop(x, int(tokens[k + 1]))
            k += 2
            continue
        if op == "flip":
            x = F.hflip(x)
        elif op == "portrait":
            x = x.transpose(1, 2).contiguous()
        elif op == "normalize":
            x = F.normalize(x, MEAN, STD)
        else:
            raise SystemExit(f"image_transforms.py: unknown step {op!r}")
        k += 1
    return x


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    x = image()
    with open(os.path.join(out, "image.bin"), "wb") as f:
        f.write(x.contiguous().numpy().tobytes())
    with open(os.path.join(out, "cases.txt"), "w") as f:
        for name, steps in CASES:
            y = run(steps, x.to(torch.float32) / 255.0).contiguous()
            assert y.dtype == torch.float32 and y.shape[0] == 3
            with open(os.path.join(out, name + ".bin"), "wb") as b:
                b.write(y.numpy().tobytes())
            f.write(f"{name} {y.shape[1]} {y.shape[2]} {steps}\n")
    torchvision.io.write_png(x[:, 14:46, 20:52].contiguous(), os.path.join(out, "square.png"))
    print(f"image_transforms.py: {len(CASES)} cases in {out}")


if __name__ == "__main__":
    main()
