#!/usr/bin/python3
"""Writes a .npz in the layout `ringtrain prepare --dataset npz` reads:
uint8 x_train/x_test [N, H, W] (or [N, H, W, C] / [N, C, H, W]) and integer
y_train/y_test [N]. Here: a slice of Debian's Fashion-MNIST, as your own data
would be (`numpy.savez` or `savez_compressed` both work).

usage: /usr/bin/python3 make_npz.py OUT.npz [TRAIN_SAMPLES] [TEST_SAMPLES]"""
import gzip
import sys

import numpy as np

SRC = "/usr/share/datasets/fashion-mnist"


def idx(name):
    for path in (f"{SRC}/{name}", f"{SRC}/{name}.gz"):
        try:
            with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
                data = f.read()
            break
        except FileNotFoundError:
            continue
    else:
        sys.exit(f"{SRC}: no {name}[.gz] (apt-get install dataset-fashion-mnist)")
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    out = sys.argv[1]
    n_train = int(sys.argv[2]) if len(sys.argv) > 2 else 60000
    n_test = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
    np.savez_compressed(out,
                        x_train=idx("train-images-idx3-ubyte")[:n_train],
                        y_train=idx("train-labels-idx1-ubyte")[:n_train].astype(np.int64),
                        x_test=idx("t10k-images-idx3-ubyte")[:n_test],
                        y_test=idx("t10k-labels-idx1-ubyte")[:n_test].astype(np.int64))
    print(f"wrote {out}: {n_train} train, {n_test} test images")


if __name__ == "__main__":
    main()
