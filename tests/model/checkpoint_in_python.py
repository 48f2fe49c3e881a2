#!/usr/bin/python3
"""A checkpoint trainer writes loads in Python with torch.load, into torchvision's model.

Runs the trainer CLI for two steps of a ResNet-18 (torchvision's layout) on synthetic 3x32x32
data, then, in Debian's python3-torch / python3-torchvision: torch.load(checkpoint) (a
TorchScript archive, which torch.load hands to torch.jit.load), takes .model.state_dict() and
loads it strictly into torchvision.models.resnet18(num_classes=10). Checks that every tensor
arrived, that the values are the trained ones (not torchvision's initialisation) and that the
model runs. Exit 0 on success, 1 with the reason otherwise.

Usage: /usr/bin/python3 tests/model/checkpoint_in_python.py TRAINER_CLI WORK_DIR
"""
import glob
import os
import shutil
import subprocess
import sys

import torch
import torchvision

RECIPE = """
[run]
name = "py"
seed = 5
[model]
name = "resnet"
depth = 18
[dataset]
name = "synthetic"
size = 32
eval_size = 16
shape = [3, 32, 32]
num_classes = 10
[training]
epochs = 1
batch_size = 16
[optim]
name = "sgd"
lr = 0.1
[metrics]
console = false
"""


def fail(msg):
    print("checkpoint_in_python: FAIL:", msg)
    sys.exit(1)


def main():
    cli, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    recipe = os.path.join(work, "recipe.toml")
    with open(recipe, "w") as f:
        f.write(RECIPE)
    run_dir = os.path.join(work, "run")
    r = subprocess.run([cli, "--recipe", recipe, "--run-dir", run_dir, "--log-level", "warn"])
    if r.returncode != 0:
        fail(f"trainer exited {r.returncode}")
    ckpts = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "step_*.pt")))
    if not ckpts:
        fail("no checkpoint written")

    ckpt = torch.load(ckpts[-1])
    state = ckpt.model.state_dict()
    model = torchvision.models.resnet18(num_classes=10)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    result = model.load_state_dict(state, strict=True)
    if result.missing_keys or result.unexpected_keys:
        fail(f"missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    if len(state) != len(fresh):
        fail(f"{len(state)} tensors in the checkpoint, torchvision's resnet18 has {len(fresh)}")
    loaded = model.state_dict()
    for k, v in state.items():
        if not torch.equal(loaded[k], v):
            fail(f"{k} not loaded as saved")
    if torch.equal(loaded["layer3.0.conv1.weight"], fresh["layer3.0.conv1.weight"]):
        fail("layer3.0.conv1.weight is still torchvision's initialisation")
    if int(loaded["bn1.num_batches_tracked"]) != 2:
        fail(f"bn1.num_batches_tracked = {int(loaded['bn1.num_batches_tracked'])}, expected the 2 training steps")
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    if out.shape != (2, 10) or not torch.isfinite(out).all():
        fail(f"forward gave {out.shape}")
    print(f"checkpoint_in_python: OK: {os.path.basename(ckpts[-1])}, {len(state)} tensors into torchvision resnet18")


if __name__ == "__main__":
    main()
