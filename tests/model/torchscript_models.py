#!/usr/bin/python3
"""Models written in Python for model "torchscript" (tests/model/torchscript_test.cpp).

`write OUT_DIR`: scripts and saves, as a user would (torch.jit.script(model).save(path)):
  cnn.pt          a small CNN with BatchNorm (1x28x28 -> 10 classes)
  transformer.pt  a small transformer encoder over the 28 rows of a 28x28 image (LayerNorm, no
                  BatchNorm, no dropout)
  dropout.pt      a linear layer and dropout(0.5): train and eval modes differ
  seven.pt        a linear layer with 7 outputs (the data has 10 classes)
  linear.pt       a linear layer (784 -> 10): its forward allocates the logits only
  two_inputs.pt   forward(a, b) returning a tuple
  tied.pt         two linear layers sharing one weight (tied)
  state_dict.pt   torch.save(SmallCNN().state_dict()): a file, but not a module
  not_a_zip.pt    text
losses for task.loss_path (forward(outputs, targets) -> each sample's loss [N]):
  focal.pt        a scripted function: focal loss (gamma 2) for classification
  ce.pt, bce.pt, mse.pt   copies of the built-in tasks' losses (classification, multilabel,
                  regression), as a user writes them in Python
  double_bce.pt, double_mse.pt   twice bce.pt's and mse.pt's
  in_place.pt     clamps its outputs argument in place
  weighted_ce.pt  a module with a buffer: cross-entropy with class weights 1, 2, ..., 10
  mean_ce.pt      returns the batch mean (a scalar), not each sample's loss
  error_rate.pt   returns (argmax != target): no gradient
  learned.pt      a module with a parameter (a temperature)
and for cnn and transformer the reference: the same initial weights trained in a plain eager
PyTorch loop (SGD, momentum 0.9, lr 0.02, cross-entropy, one thread) on the first 256
Fashion-MNIST training images in order, batches of 32, 8 steps:
  <name>_trained.pt    torch.save(state_dict) after the 8 steps
  <name>_losses.txt    the loss of each step, one per line
and cnn_focal_trained.pt, cnn_focal_losses.txt: the cnn's reference with the focal loss (the
mean over the batch of the per-sample losses of the Python function focal.pt scripts, run
eagerly).

`check RUN_DIR`: what a run of model "torchscript" leaves loads back in Python: the run
directory's torchscript_model.pt with torch.jit.load, the newest checkpoint's model with
torch.jit.load(...).model.state_dict() (a checkpoint is a TorchScript archive); both hold the
same tensors, the state_dict loads strictly into the Python class, and both compute alike.

Debian's python3-torch (1.13); scripts/install-deps.sh installs it.
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from fashion_mnist import fashion_mnist as read_fashion_mnist  # noqa: E402

STEPS, BATCH, LR, MOMENTUM = 8, 32, 0.02, 0.9


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.head(x.flatten(1))


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(28, 32)
        self.pos = nn.Parameter(torch.randn(1, 28, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        h = self.embed(x.flatten(1, 2)) + self.pos  # [N, 1, 28, 28] -> 28 tokens of 28 pixels
        return self.head(self.norm(self.encoder(h).mean(1)))


class Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(28 * 28, 10)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x.flatten(1)))


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(28 * 28, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


class Seven(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(28 * 28, 7)

    def forward(self, x):
        return self.fc(x.flatten(1))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = nn.Linear(28 * 28, 10, bias=False)
        self.decode = nn.Linear(28 * 28, 10, bias=False)
        self.decode.weight = self.encode.weight

    def forward(self, x):
        return self.encode(x.flatten(1)) + self.decode(x.flatten(1))


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, a, b):
        return self.fc(a), self.fc(b)


def focal_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Focal loss (gamma 2): cross-entropy weighed down on samples already classified well."""
    ce = F.cross_entropy(outputs, targets, reduction="none")
    return (1.0 - torch.exp(-ce)) ** 2 * ce


focal = torch.jit.script(focal_loss)  # the file; the reference loop runs focal_loss eagerly


@torch.jit.script
def ce(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


@torch.jit.script
def bce(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(outputs, targets, reduction="none").mean(1)


@torch.jit.script
def mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(outputs, targets, reduction="none").mean(1)


@torch.jit.script
def double_bce(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return 2.0 * F.binary_cross_entropy_with_logits(outputs, targets, reduction="none").mean(1)


@torch.jit.script
def double_mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return 2.0 * F.mse_loss(outputs, targets, reduction="none").mean(1)


@torch.jit.script
def in_place(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    outputs.clamp_(-10.0, 10.0)
    return F.cross_entropy(outputs, targets, reduction="none")


@torch.jit.script
def mean_ce(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


@torch.jit.script
def error_rate(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return outputs.argmax(1).ne(targets).to(torch.float32)


class WeightedCE(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.arange(1, 11, dtype=torch.float32))

    def forward(self, outputs, targets):
        return F.cross_entropy(outputs, targets, weight=self.weight, reduction="none")


class Learned(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = nn.Parameter(torch.ones(()))

    def forward(self, outputs, targets):
        return F.cross_entropy(outputs / self.temperature, targets, reduction="none")


def fashion_mnist(n):
    """The first n training images as trainer's dataset "fashion_mnist" gives them."""
    images, labels = read_fashion_mnist("train", n)
    x = torch.from_numpy(images.copy()).to(torch.float32).div_(255.0).sub_(0.2860).div_(0.3530)
    return x, torch.from_numpy(labels.copy())


def train_reference(out, name, model, loss_fn=None):
    x, y = fashion_mnist(STEPS * BATCH)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(STEPS):
        xb, yb = x[step * BATCH:(step + 1) * BATCH], y[step * BATCH:(step + 1) * BATCH]
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb) if loss_fn is None else loss_fn(model(xb), yb).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.save(model.state_dict(), os.path.join(out, f"{name}_trained.pt"))
    with open(os.path.join(out, f"{name}_losses.txt"), "w") as f:
        f.write("".join(f"{v!r}\n" for v in losses))


def write(out):
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    for name, cls in (("cnn", SmallCNN), ("transformer", TinyTransformer)):
        torch.manual_seed(0)
        model = cls()
        init = {k: v.clone() for k, v in model.state_dict().items()}
        torch.jit.script(model).save(os.path.join(out, f"{name}.pt"))
        eager = cls()
        eager.load_state_dict(init)
        train_reference(out, name, eager)
    torch.manual_seed(0)
    model = SmallCNN()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    if not torch.equal(init["conv1.weight"], torch.jit.load(os.path.join(out, "cnn.pt")).conv1.weight):
        sys.exit("cnn.pt and the focal loss's reference start from different weights")
    train_reference(out, "cnn_focal", model, focal_loss)
    for name, fn in (("focal", focal), ("ce", ce), ("bce", bce), ("mse", mse), ("double_bce", double_bce),
                     ("double_mse", double_mse), ("in_place", in_place), ("mean_ce", mean_ce),
                     ("error_rate", error_rate)):
        fn.save(os.path.join(out, f"{name}.pt"))
    torch.jit.script(WeightedCE()).save(os.path.join(out, "weighted_ce.pt"))
    torch.jit.script(Learned()).save(os.path.join(out, "learned.pt"))
    for name, cls in (("dropout", Dropout), ("seven", Seven), ("linear", Linear), ("two_inputs", TwoInputs), ("tied", Tied)):
        torch.manual_seed(0)
        torch.jit.script(cls()).save(os.path.join(out, f"{name}.pt"))
    torch.save(SmallCNN().state_dict(), os.path.join(out, "state_dict.pt"))
    with open(os.path.join(out, "not_a_zip.pt"), "w") as f:
        f.write("a text file\n")
    print("torchscript_models: wrote", out)


def check(run_dir):
    module = torch.jit.load(os.path.join(run_dir, "torchscript_model.pt"), map_location="cpu")
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    with open(os.path.join(ckpt_dir, "latest")) as f:
        latest = f.read().strip()
    saved = torch.jit.load(os.path.join(ckpt_dir, latest), map_location="cpu").model.state_dict()
    mine = module.state_dict()
    if sorted(mine) != sorted(saved):
        sys.exit(f"different names: module {sorted(mine)} checkpoint {sorted(saved)}")
    for k, v in mine.items():
        if not torch.equal(v, saved[k]):
            sys.exit(f"{k}: the module's tensor differs from the checkpoint's")
    fresh = SmallCNN()
    fresh.load_state_dict(saved)  # strict: the checkpoint is a state_dict of the Python class
    module.eval()
    fresh.eval()
    x, _ = fashion_mnist(4)
    with torch.no_grad():
        if not torch.allclose(module(x), fresh(x), rtol=0, atol=1e-6):
            sys.exit("the module and the class with the checkpoint's state_dict compute different logits")
    print(f"torchscript_models check: OK ({len(mine)} tensors)")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        sys.exit(__doc__)
    write(sys.argv[2]) if sys.argv[1] == "write" else check(sys.argv[2])
