#!/usr/bin/python3
"""Data files as users keep them, written by NumPy and Python's csv module
(tests/data/array_datasets_test.cpp). Debian's python3-numpy and python3-torch (the
normalisation of the Fashion-MNIST images, computed with the same kernels as trainer's).

Usage: /usr/bin/python3 tests/data/array_files.py OUT_DIR

Writes into OUT_DIR:
  fmnist_{train,test}_x.npy   the first 512 / 200 Fashion-MNIST images, normalised exactly as
  fmnist_{train,test}_y.npy   trainer's dataset "fashion_mnist" does ((x / 255 - 0.2860) / 0.3530,
                              float32 [N, 1, 28, 28]) and their labels (int64 [N])
  fmnist_{train,test}.csv     the same numbers as CSV: a header "label,p0,...,p783", the label first
  fmnist_train.tsv            the same as TSV, its pixel columns quoted
  fortran_x.npy               fmnist_train_x's first 16 images as float64 in Fortran order
  uint8_x.npy, int32_y.npy    the raw pixels (uint8) and the labels as int32, 16 samples
  regression_{train,test}.csv 8 features and 2 real-valued targets y0, y1 (a fixed linear map of
                              the features plus a little noise), header "x0..x7,y0,y1"
  labels_{train,test}_{x,y}.npy  16 features and 4 boolean labels (the signs of a linear map)
  fmnist_train.npz            the same arrays as "images" and "labels", stored (numpy.savez)
  fmnist_test.npz             deflated (numpy.savez_compressed)
  bad_*                       broken files for the error tests
"""
import csv
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from fashion_mnist import fashion_mnist  # noqa: E402


def normalised(x):
    # With the ATen kernels trainer's dataset uses (Debian's python3-torch: the same LibTorch),
    # operation by operation, so that the values are the same bits.
    import torch
    return torch.from_numpy(x.copy()).to(torch.float32).div_(255.0).sub_(0.2860).div_(0.3530).numpy()


def write_csv(path, header, rows, delimiter=",", quote=csv.QUOTE_MINIMAL):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter=delimiter, quoting=quote)
        w.writerow(header)
        w.writerows(rows)


def main(out):
    os.makedirs(out, exist_ok=True)
    p = lambda name: os.path.join(out, name)
    for split, stem, n in (("train", "train", 512), ("test", "t10k", 200)):
        raw, y = fashion_mnist(stem, n)
        x = normalised(raw)
        np.save(p(f"fmnist_{split}_x.npy"), x)
        np.save(p(f"fmnist_{split}_y.npy"), y)
        # The training archive stored (savez), the test archive deflated (savez_compressed).
        (np.savez if split == "train" else np.savez_compressed)(p(f"fmnist_{split}.npz"), images=x, labels=y)
        header = ["label"] + [f"p{i}" for i in range(784)]
        # repr of each float32 as a Python float: the exact value, read back exactly.
        rows = [[int(y[i])] + [repr(float(v)) for v in x[i].reshape(-1)] for i in range(n)]
        write_csv(p(f"fmnist_{split}.csv"), header, rows)
        if split == "train":
            write_csv(p("fmnist_train.tsv"), header, rows, delimiter="\t", quote=csv.QUOTE_NONNUMERIC)
            np.save(p("fortran_x.npy"), np.asfortranarray(x[:16].astype(np.float64)))
            np.save(p("uint8_x.npy"), raw[:16])
            np.save(p("int32_y.npy"), y[:16].astype(np.int32))

    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 2))
    for split, n in (("train", 600), ("test", 200)):
        x = rng.normal(size=(n, 8))
        y = x @ w + 0.01 * rng.normal(size=(n, 2))
        write_csv(p(f"regression_{split}.csv"), [f"x{i}" for i in range(8)] + ["y0", "y1"],
                  [[repr(float(v)) for v in np.concatenate([x[i], y[i]])] for i in range(n)])
    m = rng.normal(size=(16, 4))
    for split, n in (("train", 600), ("test", 200)):
        x = rng.normal(size=(n, 16)).astype(np.float32)
        np.save(p(f"labels_{split}_x.npy"), x)
        np.save(p(f"labels_{split}_y.npy"), (x @ m) > 0)

    # Negative whole-number targets (counts, deltas): values for a regression, not classes.
    with open(p("counts.csv"), "w") as f:
        f.write("a,b,y\n1,2,-3\n2,1,4\n0.5,1,-1\n")
    # A byte order mark, CRLF line ends and blank lines.
    with open(p("bom.csv"), "wb") as f:
        f.write(b"\xef\xbb\xbfa,b,y\r\n\r\n1,2,0\r\n\r\n3,4,1\r\n")
    # Classes 0-2 to train on; a test split with class 5 after its first 8 rows.
    write_csv(p("three_train.csv"), ["a", "b", "y"], [[i, -i, i % 3] for i in range(12)])
    write_csv(p("unseen_test.csv"), ["a", "b", "y"], [[i, -i, i % 2] for i in range(9)] + [[1, 1, 5]])

    # Broken files.
    with open(p("bad_header_only.csv"), "w") as f:
        f.write("a,b,y\n")
    with open(p("bad_number.csv"), "w") as f:
        f.write("a,b,y\n1,2,0\n3,4,1\n5,abc,0\n")
    with open(p("bad_fields.csv"), "w") as f:
        f.write("a,b,y\n1,2,0\n3,4\n")
    with open(p("bad_quote.csv"), "w") as f:
        f.write('a,b,y\n1,"2,0\n')
    with open(p("bad_empty.csv"), "w") as f:
        f.write("a,b,y\n1,,0\n")
    good = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(p("bad_truncated.npy"), good)
    with open(p("bad_truncated.npy"), "r+b") as f:
        f.truncate(os.path.getsize(p("bad_truncated.npy")) - 4)
    np.save(p("bad_bigendian.npy"), good.astype(">f4"))
    np.save(p("bad_object.npy"), np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    np.save(p("bad_complex.npy"), np.zeros(3, dtype=np.complex64))
    np.save(p("bad_count_y.npy"), np.zeros(5, dtype=np.int64))
    np.savez(p("bad_archive.npz"), x=good)
    # An entry whose central directory declares far more than its compressed bytes inflate to.
    np.savez_compressed(p("bad_bomb.npz"), x=good, y=np.arange(3))
    data = bytearray(open(p("bad_bomb.npz"), "rb").read())
    at = data.index(b"PK\x01\x02")
    data[at + 24:at + 28] = (0x7FFFFFF0).to_bytes(4, "little")  # the first entry's inflated size
    open(p("bad_bomb.npz"), "wb").write(bytes(data))
    # A deflated entry with a damaged byte in its compressed data.
    np.savez_compressed(p("bad_damaged.npz"), x=np.arange(4000, dtype=np.float32).reshape(1000, 4),
                        y=np.zeros(1000, dtype=np.int64))
    data = bytearray(open(p("bad_damaged.npz"), "rb").read())
    name_len = int.from_bytes(data[26:28], "little") + int.from_bytes(data[28:30], "little")
    data[30 + name_len + 40] ^= 0xFF
    open(p("bad_damaged.npz"), "wb").write(bytes(data))
    print("array_files: wrote", out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
