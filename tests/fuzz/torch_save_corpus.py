#!/usr/bin/python3
"""Writes the seed corpus of the torch.save fuzz target (tests/fuzz/torch_save_fuzz.cpp): small
files as Python's torch.save writes them (Debian's python3-torch), each under 10 KB; a
TorchScript archive whose __setstate__ would create a file if torch::jit::load read it; and,
given the trainer executable and its plugin directory, a checkpoint and a LoRA adapter file of
tiny runs (TorchScript archives as trainer writes them, under 30 KB).

Usage: /usr/bin/python3 tests/fuzz/torch_save_corpus.py tests/fuzz/corpus_torch_save [TRAINER PLUGIN_DIR]
"""
import collections
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Tuple

import torch


class Hostile(torch.nn.Module):
    """Scripted, its __setstate__ runs when torch::jit::load reads the file: torch.from_file with
    shared=True creates the file it names."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker
        self.w = torch.nn.Parameter(torch.ones(2))

    @torch.jit.export
    def __getstate__(self) -> Tuple[str, bool]:
        return (self.marker, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, bool]) -> None:
        self.marker = state[0]
        self.training = state[1]
        self.w = torch.from_file(self.marker, True, 2, dtype=torch.float)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


# Tiny runs on synthetic data: a checkpoint of an MLP with AdamW's state, and a LoRA run over the
# ViT the first run trained (model.weights), whose adapters it saves.
RECIPE = """
[run]
name = "{name}"
seed = 1
[model]
{model}
[dataset]
name = "synthetic"
size = 4
eval_size = 2
shape = [1, 4, 4]
num_classes = 2
[training]
epochs = 1
batch_size = 4
[optim]
name = "adamw"
[eval]
at_end = false
[metrics]
console = false
{plugins}
"""
VIT = 'name = "vit"\npatch_size = 2\nhidden_dim = 4\nnum_layers = 1\nnum_heads = 1\nmlp_dim = 4'
LORA = '[plugins]\nload = ["lora"]\n[plugins.lora]\nrank = 1\nalpha = 1.0\ntargets = ["*.q_proj"]'


def trainer_files(out, trainer, plugin_dir):
    with tempfile.TemporaryDirectory() as tmp:
        def run(name, model, plugins=""):
            recipe = os.path.join(tmp, name + ".toml")
            with open(recipe, "w") as f:
                f.write(RECIPE.format(name=name, model=model, plugins=plugins))
            subprocess.run([trainer, "--recipe", recipe, "run.dir=" + tmp, "--plugin-dir", plugin_dir], check=True,
                           stdout=subprocess.DEVNULL)
            return glob.glob(os.path.join(tmp, name + "-*"))[0]

        mlp = run("mlp", 'name = "mlp"\nhidden = [2]')
        shutil.copy(glob.glob(os.path.join(mlp, "checkpoints", "step_*.pt"))[0], os.path.join(out, "trainer_checkpoint"))
        vit = run("vit", VIT)
        lora = run("lora", VIT + '\nweights = "' + vit + '"', LORA)
        shutil.copy(os.path.join(lora, "lora_adapters.pt"), os.path.join(out, "trainer_lora_adapters"))
    for name in ("trainer_checkpoint", "trainer_lora_adapters"):
        assert os.path.getsize(os.path.join(out, name)) < 30_000, (name, os.path.getsize(os.path.join(out, name)))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)

    def save(name, obj, **kw):
        path = os.path.join(out, name)
        torch.save(obj, path, **kw)
        assert os.path.getsize(path) < 10_000, (name, os.path.getsize(path))

    # A module's state_dict: an OrderedDict of parameters and buffers (BatchNorm's int64 counter).
    save("linear_bn_state_dict", torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).state_dict())
    # Views: a transposed tensor, a slice at an offset and a tensor sharing one storage; 0-d and empty.
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    save("views", {"t": base.t(), "slice": base[1:, 2:], "same": base, "scalar": torch.tensor(7), "empty": torch.zeros(0, 3)})
    # Every dtype a storage may have.
    save("dtypes", collections.OrderedDict(
        (str(dt).replace("torch.", ""), torch.ones(2, dtype=dt))
        for dt in (torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16, torch.int32, torch.bool,
                   torch.complex64)))
    # A training checkpoint in pickle protocol 4: the state_dict wrapped, with scalars of every kind.
    save("wrapped_protocol4", {"state_dict": collections.OrderedDict(w=torch.randn(2, 2), b=torch.zeros(2)), "epoch": 3,
                               "meta": {"big": 2**70, "neg": -5, "pi": 3.25, "s": "ünïcode", "b": b"xy", "n": None,
                                        "t": (1, True), "l": [1.5, [2]], "set": {1, 2}, "fs": frozenset({3})}},
         pickle_protocol=4)
    # A parameter (torch._utils._rebuild_parameter) rather than a plain tensor.
    save("parameter", {"p": torch.nn.Parameter(torch.ones(3))})
    torch.jit.script(Hostile("/tmp/trainer-torch-save-fuzz-hostile-ran")).save(os.path.join(out, "hostile_setstate"))
    if len(sys.argv) > 3:
        trainer_files(out, sys.argv[2], sys.argv[3])
    print("torch.save corpus written to", out)


if __name__ == "__main__":
    main()
