#!/usr/bin/python3
"""The PyTorch eager loop a Python user would write instead of trainer.

The default recipe's job (recipes/fashion_mnist.toml) in plain PyTorch: the same model
(conv32-conv64 with BatchNorm, fc128, dropout 0.25), data and normalisation, seed, data
order, AdamW settings, LR warm-up + cosine, batch sizes, evaluation and checkpoint every
epoch; with --precision bf16, bf16 autocast around each forward and loss (as trainer's
mixed_precision plugin). Runs on Debian's python3-torch (LibTorch 1.13, the library trainer links);
scripts/install-deps.sh installs it. bench/peer/peer_bench.py runs it beside trainer and the
hand-written C++ loop.

Prints one JSON object per line on stdout:
  {"event":"eval","epoch":E,"step":S,"accuracy":A,"loss":L,"time":UNIX_SECONDS}
  {"event":"end","train_samples":N,"train_seconds":T,"samples_per_s":R}
train_seconds is the training phases only (epoch order, steps; no evaluation, no checkpoint),
as trainer's train/samples_per_s; an eval record's time is taken when the evaluation ends,
before the checkpoint, as trainer stamps eval/accuracy.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def read_idx(stem):
    """An IDX file, <stem>.gz or plain <stem>: magic 00 00 08 ndim, big-endian dims, uint8 data."""
    if os.path.exists(stem + ".gz"):
        with gzip.open(stem + ".gz", "rb") as f:
            data = f.read()
    elif os.path.exists(stem):
        with open(stem, "rb") as f:
            data = f.read()
    else:
        sys.exit(f"peer_loop.py: no {stem}.gz (or {stem}): install Debian's dataset-fashion-mnist package "
                 "(scripts/install-deps.sh does) or pass --root DIR")
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        sys.exit(f"peer_loop.py: {stem} is not a uint8 IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy())


def load(root, stem, limit):
    x = read_idx(f"{root}/{stem}-images-idx3-ubyte")
    y = read_idx(f"{root}/{stem}-labels-idx1-ubyte").long()
    if limit:
        x, y = x[:limit], y[:limit]
    x = x.unsqueeze(1).float().div_(255.0).sub_(0.2860).div_(0.3530)
    return x.contiguous(), y.contiguous()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def lr_at(args, step, total):
    """Linear warm-up, then cosine to 0 at the last step (trainer's floating-point operations)."""
    if step < args.warmup:
        return args.lr * ((step + 1) / args.warmup)
    progress = min(1.0, (step - args.warmup) / max(1, total - 1 - args.warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return args.lr * cosine


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--out-dir", default="peer_python_run")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--eval-batch-size", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--eval-limit", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = p.parse_args()
    bf16 = args.precision == "bf16"
    if min(args.epochs, args.batch_size, args.eval_batch_size, args.log_every) < 1 or \
            min(args.warmup, args.limit, args.eval_limit) < 0:
        p.error("--epochs, --log-every and the batch sizes must be >= 1, --warmup and the limits >= 0")

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_x, train_y = load(args.root, "train", args.limit)
    test_x, test_y = load(args.root, "t10k", args.eval_limit)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.weight_decay)
    os.makedirs(args.out_dir, exist_ok=True)

    n = train_x.shape[0]
    steps_per_epoch = (n + args.batch_size - 1) // args.batch_size
    total = steps_per_epoch * args.epochs
    step = samples = 0
    train_seconds = 0.0
    kept = []
    for epoch in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(args.seed * 1000003 + epoch)
        order = torch.randperm(n, generator=gen)
        window_loss = 0.0
        for b in range(steps_per_epoch):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = train_x.index_select(0, idx), train_y.index_select(0, idx)
            for g in opt.param_groups:
                g["lr"] = lr_at(args, step, total)
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            window_loss += loss.item()
            samples += idx.shape[0]
            step += 1
            if step % args.log_every == 0:
                print(f"step {step} loss {window_loss / args.log_every:.4f}", file=sys.stderr)
                window_loss = 0.0
        train_seconds += time.perf_counter() - t0

        model.eval()
        loss_sum, correct = 0.0, 0
        with torch.no_grad():
            for i in range(0, test_x.shape[0], args.eval_batch_size):
                y = test_y[i:i + args.eval_batch_size]
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    out = model(test_x[i:i + args.eval_batch_size])
                    loss = F.cross_entropy(out, y, reduction="sum")
                loss_sum += loss.item()
                correct += out.argmax(1).eq(y).sum().item()
        m, eval_end = test_x.shape[0], time.time()
        # Checkpoint: model + optimizer, written to a temporary file and renamed; the last two kept.
        path = f"{args.out_dir}/epoch_{epoch + 1}.pt"
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1}, path + ".tmp")
        os.replace(path + ".tmp", path)
        kept.append(path)
        if len(kept) > 2:
            os.remove(kept.pop(0))
        print(json.dumps({"event": "eval", "epoch": epoch + 1, "step": step, "accuracy": correct / m,
                          "loss": loss_sum / m, "time": eval_end}), flush=True)
    print(json.dumps({"event": "end", "train_samples": samples, "train_seconds": train_seconds,
                      "samples_per_s": samples / train_seconds}), flush=True)


if __name__ == "__main__":
    main()
