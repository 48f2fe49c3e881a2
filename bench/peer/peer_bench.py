#!/usr/bin/python3
"""trainer side by side with what users would run instead, on the default recipe's job.

Runs, one after the other on this machine, the same job three ways:
  trainer   build/core/cli/trainer --recipe recipes/fashion_mnist.toml (plugins and all)
  cpp       bench/peer/peer_loop.cpp, a hand-written LibTorch C++ loop (built as peer_loop)
  python    bench/peer/peer_loop.py, a PyTorch eager loop on Debian's python3-torch
and prints, from this one invocation, trainer's ratio to each: training samples/s (training
phases only, no evaluation or checkpoint) and the time from launch to the first evaluation at
or above --target test accuracy (90 %), plus each one's accuracy per epoch.

The peers take their settings from the recipe as trainer resolves it (--print-config): seed,
epochs, batch sizes, learning rate, weight decay, warm-up, threads; the harness refuses a recipe
whose model, optimiser, schedule, checkpointing or plugins differ from what the peers implement.
The precision is the recipe's (mixed_precision's "auto" resolved by a one-step trainer run) or
--precision. With the same seed the three draw the same initial weights, data order and dropout
masks, so their accuracies match (to the fourth digit after every epoch on this job): the
comparison is of speed alone.

Usage: bench/peer/peer_bench.py [--recipe FILE] [--build-dir DIR] [--no-build] [--repeats N]
           [--epochs N] [--limit N] [--precision auto|fp32|bf16] [--target ACC]
           [--tune-peer-malloc] [--only trainer,cpp,python] [--device cpu|cuda:N] [--out-dir DIR]
           [--json FILE]
--device cuda:N runs trainer and the C++ loop on that GPU (scripts/gpu-check.sh does); the
Python loop stays on the CPU, so leave it out there (--only trainer,cpp).
See docs/benchmarks.md for the figures and the command that produced them.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = "/usr/bin/python3"  # Debian's interpreter: python3-torch is installed for it
NAMES = {"trainer": "trainer", "cpp": "hand-written LibTorch C++", "python": "PyTorch eager (Python)"}
FASHION_MNIST_TRAIN = 60000


def fail(msg):
    print(f"peer_bench: {msg}", file=sys.stderr)
    sys.exit(2)


def run(cmd, **kw):
    """Runs a set-up command; its output goes to stderr unless captured (stdout is the report)."""
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    if "capture_output" not in kw:
        kw["stdout"] = sys.stderr
    return subprocess.run(cmd, cwd=ROOT, **kw)


def trainer_cli(args):
    return os.path.join(args.build_dir, "core/cli/trainer")


def ensure_ready(args, which):
    if "python" in which and run([PY, "-c", "import torch, numpy"], capture_output=True).returncode != 0:
        if run(["bash", "scripts/install-deps.sh"]).returncode != 0:
            fail("scripts/install-deps.sh could not install python3-torch (run it as root or with sudo)")
    if not args.no_build:
        if not os.path.exists(os.path.join(args.build_dir, "CMakeCache.txt")):
            if run(["cmake", "--preset", "default", "-B", args.build_dir]).returncode != 0:
                fail(f"configuring {args.build_dir} failed")
        targets = ["trainer", "trainer_plugin_console", "trainer_plugin_mixed_precision"]
        targets += ["peer_loop"] if "cpp" in which else []
        if run(["cmake", "--build", args.build_dir, "-j2", "--target"] + targets).returncode != 0:
            fail(f"building {' '.join(targets)} in {args.build_dir} failed")
    if not os.path.exists(trainer_cli(args)):
        fail(f"{trainer_cli(args)} does not exist: build it (make build), or leave out --no-build")
    if "cpp" in which and not os.path.exists(os.path.join(args.build_dir, "bench/peer_loop")):
        fail(f"{args.build_dir}/bench/peer_loop does not exist: it is built with the benchmarks "
             "(TRAINER_BUILD_BENCH=ON, the default preset; needs Google Benchmark)")


def resolved_config(args, overrides):
    out = run([trainer_cli(args), "--recipe", args.recipe, "--print-config"] + overrides,
              capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"trainer --print-config failed:\n{out.stderr}")
    return tomllib.loads(out.stdout)


def check_same_job(c, device="cpu"):
    """The peers implement exactly this job; anything else would not be a like-for-like
    comparison. Returns the list of differences (empty when it is the job)."""
    expect = {
        ("model", "name"): "cnn", ("model", "channels"): [32, 64], ("model", "hidden"): 128,
        ("model", "dropout"): 0.25, ("model", "batch_norm"): True, ("model", "dtype"): "float32",
        ("model", "weights"): "", ("dataset", "name"): "fashion_mnist", ("optim", "name"): "adamw",
        ("optim", "betas"): [0.9, 0.999], ("optim", "eps"): 1e-8, ("sched", "name"): "cosine",
        ("sched", "min_lr_ratio"): 0.0, ("training", "grad_clip_norm"): 0.0, ("training", "drop_last"): False,
        ("training", "shuffle"): True, ("training", "max_steps"): 0, ("eval", "every_epochs"): 1,
        ("runtime", "device"): device, ("runtime", "tune_malloc"): True, ("checkpoint", "every_epochs"): 1,
        ("checkpoint", "every_steps"): 0, ("checkpoint", "keep_last"): 2, ("metrics", "jsonl"): True,
    }
    default = {("model", "weights"): ""}  # keys an older build does not print
    wrong = [f"{s}.{k} = {c.get(s, {}).get(k, default.get((s, k)))!r} (the peers implement {v!r})"
             for (s, k), v in expect.items() if c.get(s, {}).get(k, default.get((s, k))) != v]
    if c["training"].get("micro_batch_size", 0) not in (0, c["training"]["batch_size"]):
        wrong.append("training.micro_batch_size != training.batch_size (the peers take one step per batch)")
    extra = sorted(set(c["plugins"]["load"]) - {"console", "mixed_precision"})
    if extra:
        wrong.append(f"plugins.load has {extra} (the peers have no counterpart)")
    if "mixed_precision" not in c["plugins"]["load"]:
        wrong.append("plugins.load lacks mixed_precision (the harness sets the precision through it)")
    return wrong


def train_size(c):
    limit = c["dataset"]["limit"]
    return min(limit, FASHION_MNIST_TRAIN) if limit else FASHION_MNIST_TRAIN


DEBIAN_DATASETS = "/usr/share/datasets"


def dataset_root(root):
    """`root`, or where it is on this machine: as trainer reads it, a root under
    /usr/share/datasets is looked up under $TRAINER_DATASETS_DIR when that is set (the GPU
    bundle of scripts/gpu-bundle.sh unpacks Debian's dataset files elsewhere)."""
    moved = os.environ.get("TRAINER_DATASETS_DIR", "")
    norm = os.path.normpath(root)
    if not moved or os.path.commonpath([norm, DEBIAN_DATASETS]) != DEBIAN_DATASETS:
        return root
    return os.path.join(moved, os.path.relpath(norm, DEBIAN_DATASETS))


def peer_args(c, args, out_dir):
    t = c["training"]
    threads = c["runtime"]["num_threads"] or os.cpu_count()
    return ["--root", dataset_root(c["dataset"]["root"]), "--out-dir", out_dir, "--epochs", str(t["epochs"]),
            "--batch-size", str(t["batch_size"]), "--eval-batch-size", str(c["eval"]["batch_size"]),
            "--lr", repr(c["optim"]["lr"]), "--weight-decay", repr(c["optim"]["weight_decay"]),
            "--warmup", str(c["sched"]["warmup_steps"]), "--seed", str(c["run"]["seed"]),
            "--limit", str(c["dataset"]["limit"]), "--eval-limit", str(c["dataset"]["eval_limit"]),
            "--threads", str(threads), "--log-every", str(t["log_every"]), "--precision", args.precision,
            "--device", args.device]


def trainer_result(metrics_file, batch_size, n_train):
    """Evaluations and training samples/s from trainer's metrics.jsonl. train/samples_per_s is
    logged per window of steps (every log_every steps and at each epoch's end) and excludes
    evaluations and checkpoints; the windows partition the run, so total samples / the sum of
    the window times is the whole run's training rate. A window's samples follow from
    train/epoch = epoch + (batch_in_epoch + 1) / steps_per_epoch (the last batch may be short)."""
    evals, windows = {}, []
    with open(metrics_file) as f:
        for line in f:
            r = json.loads(line)
            if r["name"] == "eval/accuracy":
                evals.setdefault(r["step"], {})["accuracy"] = r["value"]
                evals[r["step"]]["time"] = r["time"]
            elif r["name"] == "eval/loss":
                evals.setdefault(r["step"], {})["loss"] = r["value"]
            elif r["name"] in ("train/epoch", "train/samples_per_s"):
                if not windows or windows[-1]["step"] != r["step"]:
                    windows.append({"step": r["step"]})
                windows[-1][r["name"]] = r["value"]
    spe = (n_train + batch_size - 1) // batch_size

    def samples_at(epoch_value):  # samples trained when train/epoch had this value
        e = int(epoch_value + 1e-9)
        return e * n_train + min(round((epoch_value - e) * spe) * batch_size, n_train)

    done, seconds = 0, 0.0
    for w in windows:
        now = samples_at(w["train/epoch"])
        if w["train/samples_per_s"] <= 0:
            raise ValueError(f"{metrics_file}: train/samples_per_s = {w['train/samples_per_s']} at step {w['step']}")
        seconds += (now - done) / w["train/samples_per_s"]
        done = now
    ordered = [dict(evals[s], step=s, epoch=i + 1) for i, s in enumerate(sorted(evals))]
    rate = done / seconds if seconds > 0 else 0.0
    return ordered, {"train_samples": done, "train_seconds": seconds, "samples_per_s": rate}


def peer_result(stdout):
    evals, end = [], None
    for line in stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if r["event"] == "eval":
                evals.append(r)
            elif r["event"] == "end":
                end = r
    return evals, end


def log_value(run_dir, pattern):
    """The first match of `pattern` in the run's trainer.log (group 1), or None."""
    try:
        with open(os.path.join(run_dir, "trainer.log")) as f:
            m = re.search(pattern, f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def resolve_precision(args, overrides):
    """What mixed_precision's precision = "auto" picks on this machine: one trainer step, read
    from its log ("mixed_precision: fp32 on cpu (...)")."""
    run_dir = os.path.join(args.out_dir, "precision-probe")
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [trainer_cli(args), "--recipe", args.recipe, "--run-dir", run_dir, "training.max_steps=1",
           "eval.every_epochs=0", "eval.at_end=false", "checkpoint.every_epochs=0", "checkpoint.at_end=false"] + overrides
    if run(cmd, capture_output=True).returncode != 0:
        fail(f"the one-step trainer run that resolves precision = \"auto\" failed: {' '.join(cmd)}")
    line = log_value(run_dir, r"(mixed_precision: .*)")
    picked = log_value(run_dir, r"mixed_precision: (\w+) on")
    if picked not in ("fp32", "bf16"):
        fail(f"could not read what precision = \"auto\" picks from {run_dir}/trainer.log ({line!r})")
    return picked, line


def run_one(which, c, args, overrides, out_dir, n_train):
    if which == "trainer":
        cmd = [trainer_cli(args), "--recipe", args.recipe, "--run-dir", out_dir] + overrides
    elif which == "cpp":
        cmd = [os.path.join(args.build_dir, "bench/peer_loop")] + peer_args(c, args, out_dir)
    else:
        cmd = [PY, os.path.join(ROOT, "bench/peer/peer_loop.py")] + peer_args(c, args, out_dir)
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    env = dict(os.environ)
    if args.tune_peer_malloc and which != "trainer":
        env.update(MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(1 << 30))
    os.makedirs(out_dir, exist_ok=True)
    stderr_file = os.path.join(out_dir, "stderr.txt")
    t0 = time.time()
    with open(stderr_file, "w") as err:
        p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        with open(stderr_file) as f:
            tail = "".join(f.readlines()[-15:])
        fail(f"{which} exited {p.returncode}: {' '.join(cmd)}\n{tail}")
    if which == "trainer":
        evals, end = trainer_result(os.path.join(out_dir, "metrics.jsonl"), c["training"]["batch_size"], n_train)
    else:
        evals, end = peer_result(p.stdout)
    if not evals or end is None:
        fail(f"{which} reported no evaluation or no end record")
    if end["train_samples"] != n_train * c["training"]["epochs"]:
        fail(f"{which} trained {end['train_samples']} samples, expected {n_train} x {c['training']['epochs']} epochs")
    hit = next((e for e in evals if e["accuracy"] >= args.target), None)
    res = {"wall_s": wall, "samples_per_s": end["samples_per_s"], "train_seconds": end["train_seconds"],
           "accuracy": [e["accuracy"] for e in evals],
           "time_to_target_s": hit["time"] - t0 if hit else None, "target_epoch": hit["epoch"] if hit else None}
    if which == "trainer":
        res["memory_format"] = log_value(out_dir, r"memory format: (\w+)")
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="recipes/fashion_mnist.toml")
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--no-build", action="store_true", help="use the build as it is (default: build it first)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each (medians reported); default 1")
    p.add_argument("--epochs", type=int, default=0, help="override training.epochs (0: the recipe's)")
    p.add_argument("--limit", type=int, default=0, help="train on the first N samples (0: the recipe's)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="for all three; auto (default): what the recipe's mixed_precision picks on this machine")
    p.add_argument("--target", type=float, default=0.90, help="test accuracy for time-to-target; default 0.90")
    p.add_argument("--tune-peer-malloc", action="store_true",
                   help="give the peers trainer's runtime.tune_malloc glibc settings (through MALLOC_*_ env)")
    p.add_argument("--only", default="trainer,cpp,python", help="comma list of trainer, cpp, python")
    p.add_argument("--device", default="cpu",
                   help="cpu (default) or cuda:N, for trainer (runtime.device) and the C++ loop; "
                        "the Python loop runs on the CPU only")
    p.add_argument("--out-dir", default=os.path.join(ROOT, "build/peer_bench"))
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    which = [w for w in args.only.split(",") if w]
    if not which or set(which) - set(NAMES) or len(set(which)) != len(which):
        p.error("--only takes a comma list of trainer, cpp, python")
    if args.device != "cpu" and "python" in which:
        p.error("--device other than cpu: the Python loop runs on the CPU only (--only trainer,cpp)")
    if args.repeats < 1 or args.epochs < 0 or args.limit < 0 or not 0 < args.target <= 1:
        p.error("--repeats >= 1; --epochs and --limit >= 0; 0 < --target <= 1")
    args.build_dir = os.path.abspath(args.build_dir)
    args.out_dir = os.path.abspath(args.out_dir)

    ensure_ready(args, which)
    overrides = [] if args.device == "cpu" else [f"runtime.device={args.device}"]
    if args.epochs:
        overrides.append(f"training.epochs={args.epochs}")
    if args.limit:
        overrides.append(f"dataset.limit={args.limit}")
    c = resolved_config(args, overrides)
    wrong = check_same_job(c, args.device)
    if wrong:
        fail("the recipe is not the job the peers implement:\n  " + "\n  ".join(wrong))
    why = f"--precision {args.precision}"
    if args.precision == "auto":
        args.precision, why = resolve_precision(args, overrides)
    overrides.append(f"plugins.mixed_precision.precision={args.precision}")
    n_train = train_size(c)

    results = {w: [] for w in which}
    for r in range(args.repeats):
        order = which[r % len(which):] + which[:r % len(which)]  # rotate, so no one always runs first
        for w in order:
            out_dir = os.path.join(args.out_dir, f"{w}-{r}")
            shutil.rmtree(out_dir, ignore_errors=True)
            res = run_one(w, c, args, overrides, out_dir, n_train)
            results[w].append(res)
            tt = res["time_to_target_s"]
            print(f"{w} run {r + 1}: {res['samples_per_s']:.0f} samples/s, to {args.target:.0%}: "
                  f"{f'{tt:.1f} s' if tt else 'never'}, accuracy {[round(a, 4) for a in res['accuracy']]}"
                  + (f", memory format {res['memory_format']}" if w == "trainer" else ""), file=sys.stderr, flush=True)

    def med(w, key):
        vals = [x[key] for x in results[w] if x[key] is not None]
        return statistics.median(vals) if vals else None

    def to_target(w):
        reached = sum(1 for x in results[w] if x["time_to_target_s"] is not None)
        t = med(w, "time_to_target_s")
        if reached == 0:
            return "never"
        return f"{t:.1f} s" + ("" if reached == len(results[w]) else f" ({reached}/{len(results[w])} runs)")

    threads = c["runtime"]["num_threads"] or os.cpu_count()
    print(f"\n{args.recipe}: {c['training']['epochs']} epochs of {n_train} samples, batch "
          f"{c['training']['batch_size']}, {threads} threads, {args.repeats} run(s) each (medians)"
          + (", peers with trainer's malloc settings" if args.tune_peer_malloc else ""))
    print(f"precision {args.precision} ({why})")
    if "trainer" in which:
        print(f"trainer's memory format: {', '.join(str(x['memory_format']) for x in results['trainer'])}")
    print(f"{'':28}{'samples/s':>10}{'to ' + format(args.target, '.0%'):>12}{'wall':>9}  test accuracy per epoch")
    for w in which:
        print(f"{NAMES[w]:28}{med(w, 'samples_per_s'):>10.0f}{to_target(w):>12}"
              f"{med(w, 'wall_s'):>8.1f}s  {' '.join(f'{a:.4f}' for a in results[w][-1]['accuracy'])}")
    if "trainer" in which:
        for w in which:
            if w == "trainer":
                continue
            ratio = med("trainer", "samples_per_s") / med(w, "samples_per_s")
            t_tr, t_w = med("trainer", "time_to_target_s"), med(w, "time_to_target_s")
            speed = f"{t_w / t_tr:.2f}x as fast" if t_tr and t_w else "n/a (target not reached by both)"
            print(f"trainer vs {NAMES[w]}: samples/s ratio {ratio:.2f}, time to {args.target:.0%}: {speed}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"recipe": args.recipe, "precision": args.precision, "tune_peer_malloc": args.tune_peer_malloc,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
