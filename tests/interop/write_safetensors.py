#!/usr/bin/python3
"""An independent safetensors writer (struct + json + numpy, no ringtrain and
no safetensors package: Debian 12 has none) for tests/interop/safetensors.cpp.

write_safetensors.py OUT: writes OUT with
  "a.weight"  F32  [3, 4]   = arange(12) * 0.25 - 1
  "b.bias"    BF16 [5]      = bfloat16 of [1, -2, 0.5, 3.140625, 1e-3] (the top 16 bits, truncation)
  "c.scalar"  F32  []       = 7.5
  "d.empty"   F32  [0, 3]
and __metadata__ {"format": "pt", "written_by": "write_safetensors.py"}. The
header is written compact, unpadded and in a different key order than
ringtrain's writer, and the data in an order other than the names' order.
"""
import json
import struct
import sys

import numpy as np


def bf16_bytes(values):
    f = np.asarray(values, dtype="<f4")
    return (f.view("<u4") >> 16).astype("<u2").tobytes()


def main(out):
    tensors = [  # data order: c, a, d, b
        ("c.scalar", "F32", [], np.asarray(7.5, dtype="<f4").tobytes()),
        ("a.weight", "F32", [3, 4], (np.arange(12, dtype="<f4") * 0.25 - 1).tobytes()),
        ("d.empty", "F32", [0, 3], b""),
        ("b.bias", "BF16", [5], bf16_bytes([1, -2, 0.5, 3.140625, 1e-3])),
    ]
    header, data, at = {}, b"", 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        data += raw
        at += len(raw)
    header = dict(reversed(list(header.items())))
    header["__metadata__"] = {"format": "pt", "written_by": "write_safetensors.py"}
    text = json.dumps(header, separators=(",", ":")).encode()
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
