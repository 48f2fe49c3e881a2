#!/usr/bin/env python3
"""Prints the table of the transfer experiment (docs/transfer-learning.md) from its run
directories: test accuracy, trainable parameters, step time, peak memory and wall time.

    python3 scripts/transfer_table.py [runs/transfer]

Every figure is read from what the runs wrote: eval/accuracy (its last value) and
train/samples_per_s from metrics.jsonl; the parameter counts, the memory summary of the
memory_log plugin and the time stamps from trainer.log; the batch size from config.toml.
Standard library only.
"""
import json
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

ROWS = [  # (run directory, model, method)
    ("pretrain_{m}", "{M}", "pretraining on classes 0-4 (30,000 images)"),
    ("scratch_{m}", "{M}", "from scratch (no pretrained weights)"),
    ("probe_{m}", "{M}", "linear probe (cached features)"),
    ("lora_{m}", "{M}", "LoRA"),
    ("finetune_{m}", "{M}", "full fine-tuning"),
]
MODELS = [("vit", "ViT (tiny)"), ("resnet", "ResNet-18")]
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


class RunError(Exception):
    pass


def mib(text):
    number, unit = text.split()
    return float(number) * UNITS[unit] / (1 << 20)


def ms(x):
    return f"{x:.2f}" if x < 1 else f"{x:.1f}" if x < 10 else f"{x:.0f}"


def read_run(d):
    status = json.loads((d / "status.json").read_text())
    if status.get("status") != "FINISHED":
        raise RunError(f"{d}: status {status.get('status')} ({status.get('message', '')})")
    acc, speeds = None, []
    for line in (d / "metrics.jsonl").read_text().splitlines():
        point = json.loads(line)
        if point["name"] == "eval/accuracy":
            acc = point["value"]
        elif point["name"] == "train/samples_per_s":
            speeds.append(point["value"])
    batch = int(re.search(r"^batch_size = (\d+)$", (d / "config.toml").read_text().split("[training]")[1],
                          re.M).group(1))
    log = (d / "trainer.log").read_text().splitlines()
    params = train_peak = None
    for line in log:
        if m := re.search(r"model \w+: (\d+) parameters, (\d+) trainable", line):
            params = (int(m.group(1)), int(m.group(2)))
        if m := re.search(r"memory summary \(\w+\): peak [\d.]+ \w+ allocated, ([\d.]+ \w+) while training "
                          r"\(([\d.]+ \w+) above its start\)", line):
            train_peak = (mib(m.group(1)), mib(m.group(2)))
    stamps = [datetime.strptime(l[:23], "%Y-%m-%d %H:%M:%S.%f") for l in log if re.match(r"\d{4}-\d\d-\d\d ", l)]
    if acc is None or not speeds or params is None or train_peak is None:
        raise RunError(f"{d}: eval/accuracy, train/samples_per_s, the parameter count or the memory summary "
                       "is missing (are console and memory_log loaded, metrics.jsonl on?)")
    # The first window holds the first steps' one-off costs; the median of the others is the
    # typical step (a last, shorter batch of an epoch does not move it).
    steady = speeds[1:] if len(speeds) > 2 else speeds
    return {
        "acc": acc,
        "params": params,
        "step_ms": 1000.0 * batch / statistics.median(steady),
        "peak": train_peak,
        "wall": (stamps[-1] - stamps[0]).total_seconds(),
    }


def read_rows(paths, prog, extra=None):
    """(path, run, extra(path)) for each path that exists, read by read_run; a run that cannot be
    read is said on stderr. Returns the rows and whether any could not be read."""
    rows, failed = [], False
    for path in paths:
        if not path.exists():
            continue
        try:
            rows.append((path, read_run(path), extra(path) if extra else None))
        except (RunError, OSError, ValueError, KeyError, AttributeError, IndexError) as e:
            print(f"{prog}: {e}", file=sys.stderr)
            failed = True
    return rows, failed


def cost_cells(r):
    """The cells trainable parameters | step time | peak memory (above its start) | run time."""
    total, trainable = r["params"]
    share = f" ({100.0 * trainable / total:.3g} %)" if trainable < total else ""
    return (f"{trainable:,}{share} | {ms(r['step_ms'])} ms | {r['peak'][0]:.0f} MiB ({r['peak'][1]:.0f} MiB) "
            f"| {r['wall']:.0f} s")


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/transfer")
    print("| model | method | test accuracy | trainable parameters | step time | peak memory while training "
          "(above its start) | run time |")
    print("|---|---|---|---|---|---|---|")
    failed = False
    for m, name in MODELS:
        rows, bad = read_rows([root / d.format(m=m) for d, _, _ in ROWS], "transfer_table")
        failed |= bad
        labels = {root / d.format(m=m): (model, method) for d, model, method in ROWS}
        for path, r, _ in rows:
            model, method = labels[path]
            print(f"| {model.format(M=name)} | {method} | {100.0 * r['acc']:.1f} % | {cost_cells(r)} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
