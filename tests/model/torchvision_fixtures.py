#!/usr/bin/python3
"""Writes the torchvision files the weights tests load (tests/model/weights_test.cpp).

For each model: torchvision builds it randomly initialised (seeded), torch.save writes its
state_dict as a user's file would be (<name>.pt), and <name>_io.pt holds a fixed input and
the model's logits on it in eval mode. Debian's python3-torch / python3-torchvision (1.13 /
0.14; scripts/install-deps.sh installs them).

Usage: /usr/bin/python3 tests/model/torchvision_fixtures.py OUT_DIR
"""
import argparse
import os
import sys

import torch
import torchvision
from torchvision.models.vision_transformer import VisionTransformer


class RunsACommand:
    """Unpickling this calls os.system("touch <marker>") (pickle's __reduce__)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def perturbed(model):
    """torchvision's initial values with every tensor moved off its default (BatchNorm and
    LayerNorm at 1/0, running statistics at 0/1, the ViT head at zero), so that a tensor loaded
    into the wrong place, or not at all, changes the logits."""
    torch.manual_seed(2)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("running_var"):
                t.uniform_(0.5, 2.0)
            elif name.endswith("num_batches_tracked"):
                t.fill_(7)
            elif t.is_floating_point():
                t.add_(torch.randn_like(t) * 0.1)
    return model


def resnet18():
    torch.manual_seed(0)
    return perturbed(torchvision.models.resnet18(num_classes=10))


def write(out, name, model, image):
    torch.manual_seed(1)
    x = torch.randn(2, 3, image, image)
    model.eval()
    with torch.no_grad():
        logits = model(x)
    torch.save(model.state_dict(), os.path.join(out, f"{name}.pt"))
    torch.save({"input": x, "logits": logits}, os.path.join(out, f"{name}_io.pt"))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    write(out, "resnet18", resnet18(), 64)
    torch.manual_seed(0)
    write(out, "resnet50", perturbed(torchvision.models.resnet50(num_classes=10)), 64)
    torch.manual_seed(0)
    write(out, "vit_tiny", perturbed(VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
                                                       hidden_dim=64, mlp_dim=128, num_classes=10)), 32)
    torch.manual_seed(0)
    write(out, "vit_b_16", perturbed(torchvision.models.vit_b_16()), 224)
    # Two of resnet18.pt's tensors in a plain dict, which LibTorch's pickle_load reads (it cannot
    # read the OrderedDict of a state_dict): the tests check loaded values against them.
    sd = resnet18().state_dict()
    torch.save({k: sd[k] for k in ("layer3.1.conv2.weight", "layer4.1.conv1.weight")}, os.path.join(out, "resnet18_some.pt"))
    # A torchvision model wrapped as training checkpoints often are: DataParallel's "module."
    # prefix, an optimizer's state, the run's arguments as an object.
    # Pickle protocol 4 (FRAME, MEMOIZE, SHORT_BINUNICODE, sets) and scalars of every kind beside it.
    m = resnet18()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.randn(2, 3, 64, 64)).sum().backward()
    opt.step()
    m = resnet18()  # the weights of resnet18.pt again
    torch.save({"epoch": 3, "args": argparse.Namespace(lr=0.1, arch="resnet18"), "optimizer": opt.state_dict(),
                "meta": {"neg": -5, "big": -2**40, "pi": -3.25, "text": "ünïcode", "tags": {"a", "b"},
                         "frozen": frozenset({1}), "t": (1, None, True, b"xy")},
                "state_dict": {"module." + k: v for k, v in m.state_dict().items()}},
               os.path.join(out, "resnet18_wrapped.pt"), pickle_protocol=4)
    # A file whose unpickling would run a shell command: reading it must not.
    torch.save({"state_dict": m.state_dict(), "payload": RunsACommand(os.path.join(out, "payload_ran"))},
               os.path.join(out, "resnet18_payload.pt"))
    torch.save(m.state_dict(), os.path.join(out, "resnet18_legacy.pt"), _use_new_zipfile_serialization=False)
    # An older torchvision file: no num_batches_tracked (PyTorch < 0.4.1 BatchNorm had none).
    torch.save({k: v for k, v in m.state_dict().items() if not k.endswith("num_batches_tracked")},
               os.path.join(out, "resnet18_no_nbt.pt"))
    print("torchvision fixtures written to", out)


if __name__ == "__main__":
    main()
