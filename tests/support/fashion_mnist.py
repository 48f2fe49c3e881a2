"""Fashion-MNIST as trainer's dataset "fashion_mnist" reads it, for the Python fixtures: Debian's
dataset-fashion-mnist files, gzipped in /usr/share/datasets/fashion-mnist, or wherever
TRAINER_DATASETS_DIR says (the GPU bundle carries them uncompressed); either form is read."""
import gzip
import os

import numpy as np


def read_idx(path):
    """The bytes of an IDX file: `path` + ".gz" when it exists, else `path` itself."""
    if os.path.exists(path + ".gz"):
        with gzip.open(path + ".gz", "rb") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def fashion_mnist(split, n):
    """The first n images ([n, 1, 28, 28] uint8) and labels ([n] int64) of split "train" or "t10k"."""
    root = "/usr/share/datasets/fashion-mnist"
    if os.environ.get("TRAINER_DATASETS_DIR"):
        root = os.path.join(os.environ["TRAINER_DATASETS_DIR"], "fashion-mnist")
    images = np.frombuffer(read_idx(os.path.join(root, f"{split}-images-idx3-ubyte")), np.uint8, offset=16)
    labels = np.frombuffer(read_idx(os.path.join(root, f"{split}-labels-idx1-ubyte")), np.uint8, offset=8)
    return images.reshape(-1, 1, 28, 28)[:n], labels[:n].astype(np.int64)
