"""A ringtrain checkpoint's whole tensors with h5py and numpy alone: an
independent reader of the format (include/ringtrain/checkpoint/checkpoint.hpp),
one file or a parallel checkpoint's manifest and part files.

    /usr/bin/python3 tests/support/checkpoint_tensors.py CKPT [CKPT2]
prints each tensor's name, dtype and shape (CKPT2: compares the two bit for
bit, exit 1 naming the first difference). Import: load(path) -> {name: array}.
"""
import os
import sys

import h5py
import numpy as np


def _datasets(f):
    out = []
    f["tensors"].visititems(lambda n, o: out.append((n, o)) if isinstance(o, h5py.Dataset) else None)
    return out


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def _place(part, whole, dim, parts, index, blocks):
    """Writes tensor-parallel part `index` (local rows: `blocks` blocks of equal size) into `whole`."""
    g = whole.shape[dim]
    lb = g // (blocks * parts)  # rows of one block on one rank
    for b in range(blocks):
        dst = [slice(None)] * whole.ndim
        src = [slice(None)] * whole.ndim
        dst[dim] = slice(b * (g // blocks) + index * lb, b * (g // blocks) + (index + 1) * lb)
        src[dim] = slice(b * lb, (b + 1) * lb)
        whole[tuple(dst)] = part[tuple(src)]


def load(path):
    with h5py.File(path, "r") as f:
        if "parts" not in f.attrs:
            return {n: d[()] for n, d in _datasets(f)}
        names = [p for p in _text(f.attrs["parts"]).split("\n") if p]
    acc = {}
    for name in names:
        with h5py.File(os.path.join(os.path.dirname(path), name), "r") as f:
            if _text(f.attrs["part_of"]) != os.path.basename(path):
                raise SystemExit(f"{name} belongs to {_text(f.attrs['part_of'])}, not to {path}")
            for n, d in _datasets(f):
                whole = tuple(int(x) for x in d.attrs["whole"])
                dim, parts, index, blocks = (int(x) for x in d.attrs["shard"])
                e = acc.setdefault(n, {"whole": whole, "split": (dim, parts, blocks), "parts": {}, "dtype": d.dtype})
                count = int(np.prod(whole)) // (parts if dim >= 0 else 1)
                buf = e["parts"].setdefault(index if dim >= 0 else 0, (np.zeros(count, d.dtype), np.zeros(count, bool)))
                begin = int(d.attrs["begin"])
                data = d[()].reshape(-1)
                if buf[1][begin:begin + data.size].any():
                    raise SystemExit(f"{n}: elements {begin}.. written twice")
                buf[0][begin:begin + data.size] = data
                buf[1][begin:begin + data.size] = True
    out = {}
    for n, e in acc.items():
        dim, parts, blocks = e["split"]
        for i, (_, seen) in e["parts"].items():
            if not seen.all():
                raise SystemExit(f"{n}: part {i} misses {int((~seen).sum())} elements")
        if dim < 0:
            out[n] = e["parts"][0][0].reshape(e["whole"])
            continue
        if len(e["parts"]) != parts:
            raise SystemExit(f"{n}: {len(e['parts'])} of {parts} tensor-parallel parts")
        whole = np.empty(e["whole"], e["dtype"])
        local = list(e["whole"])
        local[dim] //= parts
        for i, (buf, _) in e["parts"].items():
            _place(buf.reshape(local), whole, dim, parts, i, blocks)
        out[n] = whole
    return out


if __name__ == "__main__":
    a = load(sys.argv[1])
    if len(sys.argv) == 2:
        for n in sorted(a):
            print(n, a[n].dtype, a[n].shape)
        sys.exit(0)
    b = load(sys.argv[2])
    if a.keys() != b.keys():
        sys.exit(f"tensor names differ: {sorted(a.keys() ^ b.keys())[:5]}")
    bad = [k for k in sorted(a) if a[k].tobytes() != b[k].tobytes()]
    if bad:
        sys.exit(f"{len(bad)} of {len(a)} tensors differ, e.g. {bad[0]}")
    print(f"{len(a)} tensors bitwise equal")
