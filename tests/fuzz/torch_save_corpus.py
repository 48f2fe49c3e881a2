#!/usr/bin/python3
"""Writes the seed corpus of the torch.save fuzz target (tests/fuzz/torch_save_fuzz.cpp): small
files as Python's torch.save writes them (Debian's python3-torch), each under 10 KB.

Usage: /usr/bin/python3 tests/fuzz/torch_save_corpus.py tests/fuzz/corpus_torch_save
"""
import collections
import os
import sys

import torch


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
    print("torch.save corpus written to", out)


if __name__ == "__main__":
    main()
