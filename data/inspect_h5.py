#!/usr/bin/python3
"""Validate ringtrain data files against data/SCHEMA.md with h5py, independently
of the C++ reader, and print a one-line summary per split.

    /usr/bin/python3 data/inspect_h5.py DIR_OR_FILE [...]    (exit 1 on any violation)
"""
import glob
import os
import re
import sys

import h5py
import numpy as np

REQUIRED = ["schema_version", "name", "split", "num_classes", "class_names", "mean", "std",
            "shard_index", "num_shards", "first_index", "total_count"]


def check_file(path):
    errs = []
    with h5py.File(path, "r") as f:
        for a in REQUIRED:
            if a not in f.attrs:
                errs.append(f"attribute '{a}' missing")
        for d in ("images", "labels"):
            if d not in f:
                errs.append(f"dataset /{d} missing")
        if errs:
            return None, errs
        im, lb = f["images"], f["labels"]
        if im.ndim != 4:
            errs.append(f"/images rank {im.ndim}, want 4")
        if im.dtype != np.uint8:
            errs.append(f"/images dtype {im.dtype}, want uint8")
        if lb.ndim != 1 or lb.shape[0] != im.shape[0]:
            errs.append(f"/labels shape {lb.shape} vs /images {im.shape}")
        if not np.issubdtype(lb.dtype, np.integer):
            errs.append(f"/labels dtype {lb.dtype}, want an integer type")
        k = int(f.attrs["num_classes"])
        y = lb[:]
        if y.size and (y.min() < 0 or y.max() >= k):
            errs.append(f"labels outside [0, {k}): min {y.min()}, max {y.max()}")
        c = im.shape[1] if im.ndim == 4 else 0
        if len(f.attrs["mean"]) != c or len(f.attrs["std"]) != c:
            errs.append("mean/std need one value per channel")
        info = {a: f.attrs[a] for a in REQUIRED}
        info["count"], info["shape"], info["chunks"] = im.shape[0], im.shape[1:], im.chunks
        info["compression"] = im.compression
        return info, errs


def files_of(arg):
    if os.path.isfile(arg):
        return [arg]
    return sorted(glob.glob(os.path.join(arg, "*.h5")))


def main(args):
    bad = 0
    splits = {}
    for arg in args or ["."]:
        for p in files_of(arg):
            info, errs = check_file(p)
            for e in errs:
                print(f"{p}: {e}")
            bad += len(errs)
            if info is not None:
                key = re.sub(r"-\d{5}-of-\d{5}\.h5$|\.h5$", "", os.path.basename(p))
                splits.setdefault(key, []).append((int(info["shard_index"]), p, info))
    for key, shards in sorted(splits.items()):
        shards.sort()
        first = shards[0][2]
        n = sum(s[2]["count"] for s in shards)
        nxt = 0
        for i, (s, p, info) in enumerate(shards):
            if s != i or int(info["first_index"]) != nxt:
                print(f"{p}: shard {s} / first_index {info['first_index']} out of sequence")
                bad += 1
            nxt += info["count"]
        if n != int(first["total_count"]) or len(shards) != int(first["num_shards"]):
            print(f"{key}: {len(shards)} of {first['num_shards']} shards, {n} of {first['total_count']} samples")
            bad += 1
        print(f"{key}: {n} x {tuple(int(v) for v in first['shape'])} uint8, {first['num_classes']} classes, "
              f"{len(shards)} file(s), chunks {first['chunks']}, compression {first['compression']}, "
              f"mean {np.round(first['mean'], 4).tolist()} std {np.round(first['std'], 4).tolist()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
