#!/usr/bin/env python3
"""trainer sweep against Optuna on the same study: the space, objective, trial budget and
memory budget of recipes/sweep_fashion_mnist.toml, on the real Fashion-MNIST.

Optuna's objective calls the trainer binary for each trial, as users do today: it streams the
trial's eval/accuracy from metrics.jsonl into trial.report() so Optuna's MedianPruner can stop
it (SIGINT, as trainer sweep does), and turns an out-of-memory failure into TrialPruned.

Reports, for both: trials completed, pruned, out of memory, skipped; the compute (wall time)
spent on trials that ran out of memory; the best objective; the study's wall time.

Run (bench/sweep/optuna_compare.sh installs optuna into a virtual environment first):
  bench/sweep/optuna_compare.sh [--trials 20] [--limit 20000]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time


def trainer_overrides(limit):
    # What both studies add to the recipe: a slice of the training set, to keep the comparison
    # to minutes on 2 cores; the full test split.
    return [f"dataset.limit={limit}"]


def run_trial(trainer, recipe, overrides, run_dir, on_report):
    """Runs one trainer process; calls on_report(index, value) for each eval/accuracy it logs
    (a True return stops the trial with SIGINT). Returns (exit code, status.json, seconds)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.monotonic()
    proc = subprocess.Popen([trainer, "--recipe", recipe, *overrides, "--run-dir", run_dir, "--log-level", "warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    offset, reports, stopped = 0, 0, False
    metrics = os.path.join(run_dir, "metrics.jsonl")
    while True:
        done = proc.poll() is not None
        if os.path.exists(metrics):
            with open(metrics) as f:
                f.seek(offset)
                while True:
                    line = f.readline()
                    if not line.endswith("\n"):
                        break
                    offset = f.tell()
                    rec = json.loads(line)
                    if rec.get("name") == "eval/accuracy":
                        if on_report(reports, rec["value"]) and not stopped:
                            proc.send_signal(signal.SIGINT)
                            stopped = True
                        reports += 1
        if done:
            break
        time.sleep(0.2)
    seconds = time.monotonic() - start
    try:
        with open(os.path.join(run_dir, "status.json")) as f:
            status = json.load(f)
    except (OSError, ValueError):
        status = {}
    return proc.returncode, status, seconds, stopped


def optuna_study(args):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = {"complete": 0, "pruned": 0, "oom": 0, "failed": 0, "skipped": 0, "oom_seconds": 0.0, "trial_seconds": 0.0}

    def objective(trial):
        model = trial.suggest_categorical("model", ["mlp", "cnn"])
        batches = [32, 64, 128, 256, 512] if model == "mlp" else [32, 64, 128, 256]
        batch = trial.suggest_categorical(f"batch_size_{model}", batches)
        lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
        overrides = trainer_overrides(args.limit) + [f"model={model}", f"training.batch_size={batch}",
                                                     f"optim.lr={lr:.6g}", "training.epochs=2"]
        run_dir = os.path.join(args.work, "optuna", f"trial-{trial.number:04d}")
        last = {}

        def on_report(index, value):
            last["value"] = value
            trial.report(value, index)
            return trial.should_prune()

        rc, status, seconds, stopped = run_trial(args.trainer, args.recipe, overrides, run_dir, on_report)
        out["trial_seconds"] += seconds
        if stopped:
            out["pruned"] += 1
            raise optuna.TrialPruned()
        if rc != 0 and status.get("failure") == "out_of_memory":
            out["oom"] += 1
            out["oom_seconds"] += seconds
            raise optuna.TrialPruned()
        if rc != 0 or "value" not in last:
            out["failed"] += 1
            raise RuntimeError(f"trial failed: exit {rc}: {status.get('message', '')}")
        out["complete"] += 1
        return last["value"]

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=42),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0))
    start = time.monotonic()
    study.optimize(objective, n_trials=args.trials, catch=(RuntimeError,))
    out["wall_seconds"] = time.monotonic() - start
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    out["best"] = max(t.value for t in done) if done else None
    out["best_params"] = study.best_params if done else {}
    return out


def trainer_study(args):
    study_dir = os.path.join(args.work, "trainer-sweep")
    shutil.rmtree(study_dir, ignore_errors=True)
    start = time.monotonic()
    proc = subprocess.run([args.trainer, "sweep", "--recipe", args.recipe, *trainer_overrides(args.limit),
                           f"sweep.n_trials={args.trials}", "--study-dir", study_dir],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"trainer sweep failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    out = {"complete": 0, "pruned": 0, "oom": 0, "failed": 0, "skipped": 0, "oom_seconds": 0.0, "trial_seconds": 0.0,
           "wall_seconds": wall, "best": None}
    with open(os.path.join(study_dir, "study.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("event") != "end":
                continue
            state = rec["state"]
            out["trial_seconds"] += rec["seconds"]
            if rec["out_of_memory"]:
                out["oom"] += 1
                out["oom_seconds"] += rec["seconds"]
            elif state == "COMPLETE":
                out["complete"] += 1
                if out["best"] is None or rec["value"] > out["best"]:
                    out["best"] = rec["value"]
            elif state == "PRUNED":
                out["pruned"] += 1
            elif state == "SKIPPED":
                out["skipped"] += 1
            else:
                out["failed"] += 1
    out["summary"] = proc.stdout.strip()
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trainer", default=os.path.join(root, "build/core/cli/trainer"))
    p.add_argument("--recipe", default=os.path.join(root, "recipes/sweep_fashion_mnist.toml"))
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--limit", type=int, default=20000, help="training images (dataset.limit)")
    p.add_argument("--work", default=os.path.join(root, "build/bench/optuna-compare"))
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    results = {"trainer sweep": trainer_study(args), "optuna": optuna_study(args)}
    print(json.dumps(results, indent=1, default=str))
    print()
    print("| | trials | completed | pruned (median) | out of memory | skipped (predicted) | compute on OOM trials | "
          "time in trials | study wall time | best eval/accuracy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        best = "-" if r["best"] is None else f"{r['best']:.4f}"
        print(f"| {name} | {args.trials} | {r['complete']} | {r['pruned']} | {r['oom']} | {r['skipped']} | "
              f"{r['oom_seconds']:.1f} s | {r['trial_seconds']:.1f} s | {r['wall_seconds']:.1f} s | {best} |")


if __name__ == "__main__":
    main()
