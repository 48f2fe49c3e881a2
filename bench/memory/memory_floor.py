#!/usr/bin/python3
"""The memory floor of training: the smallest memory.limit_mb (bisected) at which ViT-B/16 at
batch 32 with AdamW trains two steps (the second holds AdamW's state throughout) under trainer, with oom_backoff's memory ladder
(exact rungs only: the default) and without it (ladder = ["micro_batch"]: today's back-off),
beside the measured peak of the same step in PyTorch eager (torchvision's VisionTransformer as
vit_b_16, its second step: what is held (parameters, AdamW's state, the batch) plus the peak of
the profiler's memory events, each event's own allocations and frees in time order).
Then the time per sample (the third of three steps) unconstrained, at the ladder's floor and at
0.4x eager's peak, one run after another at the end. Run with Debian's python3 (torch, torchvision):

    /usr/bin/python3 bench/memory/memory_floor.py --trainer build/core/cli/trainer --work /tmp/floor

Prints one line per measurement and a JSON summary (--json FILE writes it too). Takes tens of
minutes on two cores: each bisection step is a real run. --smoke shrinks the model (4 layers,
width 192, 64x64 images, batch 8) to prove in seconds that it runs.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

EAGER = r"""
import sys, torch, torchvision
batch, image, layers, width, heads, mlp = (int(a) for a in sys.argv[1:7])
torch.manual_seed(0)
m = torchvision.models.VisionTransformer(image_size=image, patch_size=16, num_layers=layers, num_heads=heads,
                                         hidden_dim=width, mlp_dim=mlp, num_classes=10)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
x, y = torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))
def step():
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(m(x), y).backward()
    opt.step()
step()  # the optimizer state exists from here on, as in a run's later steps
nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)
held = nbytes(m.parameters()) + nbytes(m.buffers()) + nbytes([x, y])
held += nbytes(t for st in opt.state.values() for t in st.values() if torch.is_tensor(t))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
    step()
# Each event's own allocations and frees (an operator's memory includes its children's), in time order.
events = sorted((e for e in prof.events() if e.self_cpu_memory_usage != 0), key=lambda e: e.time_range.start)
now = peak = 0
for e in events:
    now += e.self_cpu_memory_usage
    peak = max(peak, now)
print(held + peak)
"""


def model_keys(smoke):
    # ViT-B/16 at 224x224 (torchvision's vit_b_16), or a small one for the smoke run.
    if smoke:
        return dict(batch=8, image=64, layers=4, width=192, heads=3, mlp=768)
    return dict(batch=32, image=224, layers=12, width=768, heads=12, mlp=3072)


def eager_peak(k):
    out = subprocess.run([sys.executable, "-c", EAGER] + [str(k[n]) for n in ("batch", "image", "layers", "width",
                                                                               "heads", "mlp")],
                         check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1])


def recipe(work, k):
    path = os.path.join(work, "floor.toml")
    with open(path, "w") as f:
        f.write(f"""[run]
seed = 1
[model]
name = "vit"
patch_size = 16
num_layers = {k['layers']}
num_heads = {k['heads']}
hidden_dim = {k['width']}
mlp_dim = {k['mlp']}
dropout = 0.0
attention_dropout = 0.0
[dataset]
name = "synthetic"
size = {3 * k['batch']}
eval_size = 8
shape = [3, {k['image']}, {k['image']}]
[training]
epochs = 1
batch_size = {k['batch']}
log_every = 1
[optim]
name = "adamw"
lr = 0.001
[eval]
every_epochs = 0
at_end = false
[checkpoint]
every_epochs = 0
at_end = false
[metrics]
console = false
[plugins]
load = ["oom_backoff"]
""")
    return path


def run(trainer, path, work, name, extra):
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    start = time.time()
    p = subprocess.run([trainer, "--recipe", path, "--run-dir", d] + extra, capture_output=True, text=True)
    return p.returncode, d, time.time() - start


def last_metric(run_dir, name):
    value = None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if m["name"] == name:
                value = m["value"]
    return value


def floor(trainer, path, work, label, extra, lo, hi, precision):
    """The smallest limit (MiB) in (lo, hi] at which one step runs: hi must run, lo need not."""
    rc, _, _ = run(trainer, path, work, f"{label}-hi", extra + [f"memory.limit_mb={hi:.3f}", "training.max_steps=2"])
    if rc != 0:
        raise SystemExit(f"{label}: {hi:.1f} MiB does not run either (exit {rc})")
    while hi - lo > precision * hi:
        mid = (lo + hi) / 2
        rc, _, secs = run(trainer, path, work, f"{label}-{mid:.0f}", extra + [f"memory.limit_mb={mid:.3f}",
                                                                          "training.max_steps=2"])
        print(f"  {label}: {mid:9.1f} MiB -> {'runs' if rc == 0 else f'exit {rc}'} ({secs:.0f} s)", flush=True)
        if rc == 0:
            hi = mid
        else:
            lo = mid
    return hi


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--trainer", required=True)
    a.add_argument("--work", required=True)
    a.add_argument("--smoke", action="store_true")
    a.add_argument("--precision", type=float, default=0.02, help="bisect until the bracket is this fraction wide")
    a.add_argument("--json")
    # What an earlier, interrupted run of this script measured (each bisection step is minutes).
    a.add_argument("--eager-mib", type=float, help="PyTorch eager's peak as measured before")
    a.add_argument("--trainer-peak-mib", type=float, help="trainer's unconstrained peak as measured before")
    a.add_argument("--without-bracket", type=float, nargs=2, metavar=("LO", "HI"),
                   help="the bisection without the ladder so far: LO did not run, HI ran")
    args = a.parse_args()
    os.makedirs(args.work, exist_ok=True)
    k = model_keys(args.smoke)
    path = recipe(args.work, k)
    mib = 1024.0 * 1024.0

    eager = args.eager_mib or eager_peak(k) / mib
    print(f"PyTorch eager peak: {eager:.1f} MiB", flush=True)
    # The bisections first: whether a run fits does not depend on how busy the machine is. The runs
    # timed come last, one after another, so that they see the same machine.
    peak = args.trainer_peak_mib
    if not peak:
        rc, full_dir, _ = run(args.trainer, path, args.work, "unconstrained-peak",
                              ["training.max_steps=2", "plugins.load=[\"oom_backoff\", \"memory_log\"]"])
        if rc != 0:
            raise SystemExit(f"the unconstrained run failed (exit {rc}); see {full_dir}")
        peak = last_metric(full_dir, "memory/peak_mb")
    print(f"trainer unconstrained: peak {peak:.1f} MiB", flush=True)
    # Parameters, gradients and AdamW's two moments: no step runs below four times the model.
    params = (k["layers"] * (4 * k["width"] ** 2 + 2 * k["width"] * k["mlp"])) * 4 / mib
    lo, hi = args.without_bracket or (4 * params, max(peak, eager) * 1.1)
    without = floor(args.trainer, path, args.work, "micro_batch only", ["+plugins.oom_backoff.ladder=[\"micro_batch\"]"],
                    lo, hi, args.precision)
    print(f"floor without the ladder: {without:.1f} MiB", flush=True)
    ladder = floor(args.trainer, path, args.work, "ladder", [], 4 * params, without, args.precision)
    print(f"floor with the ladder: {ladder:.1f} MiB", flush=True)

    def timed(name, limit):
        """Samples per second of the last of three steps (the first two find the rung), and where it ran."""
        extra = ["training.max_steps=3"] + ([f"memory.limit_mb={limit:.3f}"] if limit else [])
        rc, d, _ = run(args.trainer, path, args.work, name, extra)
        if rc != 0:
            return {"limit_mib": limit, "exit_code": rc}
        status = json.load(open(os.path.join(d, "status.json")))
        return {"limit_mib": limit, "exit_code": rc, "samples_per_s": last_metric(d, "train/samples_per_s"),
                "micro_batch": last_metric(d, "train/micro_batch_size"),
                "checkpointed_blocks": status.get("checkpointed_blocks", 0)}

    print("timed runs (keep the machine quiet)", flush=True)
    full = timed("timed-unconstrained", None)
    at_floor = timed("timed-at-floor", ladder)
    at_goal = timed("timed-at-0.4x-eager", 0.4 * eager)
    for name, t in (("unconstrained", full), ("at the ladder's floor", at_floor), ("at 0.4x eager's peak", at_goal)):
        print(f"{name}: {t}", flush=True)

    def over(t):
        return full["samples_per_s"] / t["samples_per_s"] if t.get("samples_per_s") and full.get("samples_per_s") \
            else None
    summary = {"model": k, "eager_peak_mib": eager, "trainer_peak_mib": peak, "floor_without_ladder_mib": without,
               "floor_with_ladder_mib": ladder, "floor_over_eager": ladder / eager,
               "without_over_eager": without / eager, "unconstrained": full, "at_floor": at_floor,
               "at_0.4x_eager": at_goal, "time_per_sample_at_floor_over_unconstrained": over(at_floor),
               "time_per_sample_at_0.4x_eager_over_unconstrained": over(at_goal)}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
