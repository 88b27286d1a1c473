#!/usr/bin/python3
"""Writes ringtrain's HDF5 schema (data/SCHEMA.md) directly with h5py, for
data that is already in NumPy: one file per split, checked afterwards with
`ringtrain prepare --check OUT_DIR`.

usage: /usr/bin/python3 write_h5.py IN.npz OUT_DIR [NAME]"""
import os
import sys

import h5py
import numpy as np


def nchw(x):
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4 and x.shape[3] <= 4:
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return x


def write(path, name, split, x, y, classes, mean, std, source):
    tmp = f"{path}.tmp-{os.getpid()}"  # complete or absent, like ringtrain prepare
    with h5py.File(tmp, "w") as f:
        f.create_dataset("images", data=x.astype(np.uint8), chunks=(min(len(x), 256),) + x.shape[1:])
        f.create_dataset("labels", data=y.astype(np.int64))
        a = f.attrs
        a["schema_version"] = np.int64(1)
        a["name"], a["split"], a["layout"] = name, split, "NCHW"
        a["num_classes"] = np.int64(len(classes))
        a["class_names"] = classes
        a["mean"], a["std"] = mean, std
        a["source_files"] = [source]
        a["shard_index"], a["num_shards"] = np.int64(0), np.int64(1)
        a["first_index"], a["total_count"] = np.int64(0), np.int64(len(x))
    os.replace(tmp, path)


def main():
    src, out = sys.argv[1], sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else os.path.splitext(os.path.basename(src))[0]
    d = np.load(src)
    x_train, x_test = nchw(d["x_train"]), nchw(d["x_test"])
    y_train, y_test = d["y_train"].reshape(-1), d["y_test"].reshape(-1)
    k = int(max(y_train.max(), y_test.max())) + 1
    classes = [str(i) for i in range(k)]
    pixels = x_train.astype(np.float64) / 255.0  # train statistics, stored in both splits
    mean = pixels.mean(axis=(0, 2, 3))
    std = pixels.std(axis=(0, 2, 3))
    std[std <= 0] = 1.0
    os.makedirs(out, exist_ok=True)
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        write(os.path.join(out, f"{name}-{split}.h5"), name, split, x, y, classes, mean, std, src)
    print(f"wrote {out}/{name}-{{train,test}}.h5: {len(x_train)} + {len(x_test)} samples, {k} classes")


if __name__ == "__main__":
    main()
