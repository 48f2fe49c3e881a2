#!/usr/bin/python3
"""The memory snapshot of an out-of-memory error, read by PyTorch's own memory viewer functions.

Runs the trainer CLI on a CNN whose first backward runs out of memory under memory.limit_mb
(oom_backoff then halves the micro-batch), then reads RUN_DIR/memory/oom-*.pickle:

- with pickle.load, checking it against the snapshot's JSON beside it: one segment per listed
  block, the active blocks' bytes by the category their frames name equal to the JSON's
  categories, their sum to its "allocated", the trace's allocations oldest first and its "oom"
  entry the refused request;
- with Debian's torch 1.13 torch.cuda._memory_viz (stats, segments, memory; the flame graphs'
  input lines, without the flamegraph.pl script), which takes the list of segments;
- with PyPI's torch 2.x torch/cuda/_memory_viz.py (MODULE_DIR, from
  tests/memory/torch2_memory_viz.sh), which takes the whole dict: segsum, trace, segments,
  memory, and trace_plot/segment_plot, whose HTML carries the same snapshot back.

Exit 0 on success, 1 with the reason otherwise.

Usage: /usr/bin/python3 tests/memory/snapshot_in_python.py TRAINER_CLI WORK_DIR MODULE_DIR
"""
import base64
import collections
import glob
import importlib.util
import json
import os
import pickle
import re
import shutil
import subprocess
import sys

import torch.cuda._memory_viz as viz113

# 64 samples of 3x32x32 through two 32-channel convolutions: the feature maps the forward keeps
# for the backward (about 9 MiB at 64 samples) do not fit in the budget beside the data set;
# half of them do.
RECIPE = """
[run]
seed = 5
[model]
name = "cnn"
channels = [32, 32]
hidden = 16
batch_norm = false
memory_format = "contiguous"  # auto picks a layout by timing, and the layouts' memory differs
[dataset]
name = "synthetic"
size = 64
eval_size = 8
shape = [3, 32, 32]
[training]
epochs = 1
batch_size = 64
[optim]
name = "adamw"
lr = 0.01
[eval]
every_epochs = 0
at_end = false
[memory]
limit_mb = LIMIT_MB
[plugins]
load = ["oom_backoff"]
[metrics]
console = false
"""
LIMIT_MB = 12


def fail(msg):
    print("snapshot_in_python: FAIL:", msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def frame(frames, filename):
    for f in frames:
        if f["filename"] == filename:
            return f["name"]
    fail(f"no {filename} frame in {frames}")


def flame_bytes(lines, key):
    """Bytes of a flame graph's input lines ("a;b;c 123") by the frame of `key` ("category")."""
    out = collections.Counter()
    for line in lines.splitlines():
        stack, size = line.rsplit(" ", 1)
        m = re.search(key + r":0:([a-z_]+)", stack)
        out[m.group(1) if m else "<" + stack.split(";")[-1] + ">"] += int(size)
    return out


def main():
    cli, work, module_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    recipe = os.path.join(work, "recipe.toml")
    with open(recipe, "w") as f:
        f.write(RECIPE.replace("LIMIT_MB", str(LIMIT_MB)))
    run_dir = os.path.join(work, "run")
    r = subprocess.run([cli, "--recipe", recipe, "--run-dir", run_dir, "--log-level", "warn"])
    check(r.returncode == 0, f"trainer exited {r.returncode}")
    pickles = sorted(glob.glob(os.path.join(run_dir, "memory", "oom-*.pickle")))
    check(pickles, f"no snapshot in {run_dir}/memory")
    spec = importlib.util.spec_from_file_location("memory_viz_2x", os.path.join(module_dir, "_memory_viz.py"))
    viz2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(viz2)
    for path in pickles:
        read_snapshot(path, viz2)
    with open(os.path.join(module_dir, "VERSION")) as f:
        version = f.read().strip()
    print(f"snapshot_in_python: OK: {len(pickles)} snapshots ({', '.join(map(os.path.basename, pickles))}); "
          f"torch 1.13's and {version}'s viewer functions")


def read_snapshot(path, viz2):
    with open(path[: -len(".pickle")] + ".json") as f:
        js = json.load(f)
    with open(path, "rb") as f:
        data = pickle.load(f)

    # The file itself, against its JSON.
    check(isinstance(data, dict) and set(data) >= {"segments", "device_traces"}, f"keys {list(data)}")
    segs = data["segments"]
    check(len(segs) == js["blocks"], f"{len(segs)} segments, {js['blocks']} blocks listed")
    check(js["blocks_left_out"] == 0, "blocks left out")
    by_category = collections.Counter()
    for s in segs:
        check(s["total_size"] == sum(b["size"] for b in s["blocks"]), f"segment {s['address']} does not add up")
        active = [b for b in s["blocks"] if b["state"] == "active_allocated"]
        check(len(active) == 1, f"segment {s['address']}: {len(active)} active blocks")
        by_category[frame(active[0]["frames"], "category")] += active[0]["size"]
    categories = {k: v for k, v in js["categories"].items() if v}
    check(dict(by_category) == categories, f"blocks by category {dict(by_category)}, JSON {categories}")
    check(sum(by_category.values()) == js["allocated"], "the blocks do not add up to allocated")
    trace = data["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    check([e["addr"] for e in allocs] == [s["blocks"][-1]["address"] for s in segs], "trace order")
    check(trace[-1]["action"] == "oom" and trace[-1]["size"] == js["requested"], f"last trace entry {trace[-1]}")
    largest = max(by_category, key=by_category.get)
    check(largest == js["largest_category"], f"largest {largest}, JSON {js['largest_category']}")

    # Torch 1.13's functions: the list of segments.
    stats = viz113.stats(segs)
    check(stats["segments"] == len(segs), f"1.13 stats {stats}")
    check(stats["active_allocated"].value == js["allocated"], f"1.13 stats {stats}")
    for fn in (viz113.segments, viz113.memory):
        lines = fn(segs, format_flamegraph=lambda s: s)
        flame = flame_bytes(lines, "category")
        check({k: v for k, v in flame.items() if not k.startswith("<")} == categories, f"1.13 {fn.__name__}: {flame}")

    # Torch 2.x's functions: the dict, as _dump_snapshot writes it.
    summary = viz2.segsum(data)
    check(f"segments: {len(segs)}" in summary, summary)
    text = viz2.trace(data)
    check(f"{len(trace)} entries" in text, "2.x trace: " + text[:200])
    check(text.count(" = MEM[") + text.count(" = seg_") == len(allocs), "2.x trace: not every allocation")
    # (versions write "raise OutOfMemoryError()" or "raise OutOfMemoryError").
    check(re.search(r"raise OutOfMemoryError(\(\))? # ", text), "2.x trace without the out-of-memory error")
    for fn in (viz2.segments, viz2.memory):
        flame = flame_bytes(fn(data, format_flamegraph=lambda s: s), "category")
        check({k: v for k, v in flame.items() if not k.startswith("<")} == categories, f"2.x {fn.__name__}: {flame}")
    for plot in (viz2.trace_plot, viz2.segment_plot):
        html = plot(data)
        m = re.search(r'"base64": "([A-Za-z0-9+/=]+)"', html)
        check(m, f"2.x {plot.__name__}: no snapshot in the page")
        check(pickle.loads(base64.b64decode(m.group(1))) == data, f"2.x {plot.__name__}: another snapshot")
    print(f"{os.path.basename(path)}: {len(segs)} blocks, {js['allocated']} bytes, largest {largest}")


if __name__ == "__main__":
    main()
