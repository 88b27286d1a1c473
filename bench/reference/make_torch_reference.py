#!/usr/bin/python3
"""Reference loss and gradients from PyTorch for ringtrain's cross-check.

Usage: make_torch_reference.py DIR [DIR...] [--dtype float64|float32]
(several DIRs share one interpreter start-up). Each DIR holds what the ringtrain test wrote:
  meta.json   {"model", "in_channels", "height", "width", "classes", "depth",
               "base_width", "heads", "mlp_ratio", "patch", "batch", "smoothing",
               "params": [{"name", "shape"}]}
  params.bin  float32 parameters concatenated in ringtrain's arena order
  x.bin       float32 input [batch, C, H, W];  labels.bin  int64 [batch]
              (gpt, "seq_len" > 0: token ids as float32 [batch, seq_len], labels int64 [batch, seq_len],
              the mean cross-entropy over every token)
Writes into DIR:
  ref_loss.txt  the mean loss;  ref_grads.bin  float64 gradients, same order;
  ref_buffers.bin  float64 BN running mean/var after the train-mode forward
  (ringtrain's buffer order: per BN, running_mean then running_var).
Names must match torch's state_dict names one by one: a mismatch is an error.
"""
import json
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the caller skips (exit code 77) rather than fails
    print("make_torch_reference: %s" % e, file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402


def main():
    args = sys.argv[1:]
    dtype = torch.float64
    if "--dtype" in args:
        i = args.index("--dtype")
        dtype = {"float64": torch.float64, "float32": torch.float32}[args[i + 1]]
        del args[i:i + 2]
    for d in args:
        reference(d, dtype)


def reference(d, dtype):
    meta = json.load(open(os.path.join(d, "meta.json")))
    torch.manual_seed(0)
    m = torch_models.build(meta["model"], meta["in_channels"], meta["height"], meta["width"], meta["classes"],
                           meta.get("depth", 20), meta.get("base_width", 16), meta.get("heads", 4),
                           meta.get("mlp_ratio", 4.0), meta.get("patch", 4), meta.get("seq_len", 0)).to(dtype)
    named = dict(m.named_parameters())
    flat = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32)
    off = 0
    order = []
    for p in meta["params"]:
        if p["name"] not in named:
            raise SystemExit("ringtrain parameter %s has no PyTorch twin" % p["name"])
        t = named[p["name"]]
        if list(t.shape) != p["shape"]:
            raise SystemExit("%s: ringtrain shape %s, torch %s" % (p["name"], p["shape"], list(t.shape)))
        n = t.numel()
        with torch.no_grad():
            t.copy_(torch.from_numpy(flat[off:off + n].reshape(p["shape"])).to(dtype))
        off += n
        order.append(t)
    if off != flat.size or len(order) != len(named):
        raise SystemExit("parameter count mismatch: file %d values, %d tensors vs torch %d" %
                         (flat.size, len(order), len(named)))
    b, c, h, w = meta["batch"], meta["in_channels"], meta["height"], meta["width"]
    shape = (b, meta["seq_len"]) if meta.get("seq_len", 0) > 0 else (b, c, h, w)
    x = torch.from_numpy(np.fromfile(os.path.join(d, "x.bin"), dtype=np.float32).reshape(shape)).to(dtype)
    y = torch.from_numpy(np.fromfile(os.path.join(d, "labels.bin"), dtype=np.int64)).reshape(-1)
    m.train()
    out = m(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y, label_smoothing=meta.get("smoothing", 0.0))
    loss.backward()
    with open(os.path.join(d, "ref_loss.txt"), "w") as f:
        f.write("%.17g\n" % loss.item())
    np.concatenate([t.grad.detach().double().numpy().ravel() for t in order]).tofile(os.path.join(d, "ref_grads.bin"))
    bufs = []
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            bufs += [mod.running_mean.double().numpy(), mod.running_var.double().numpy()]
    np.concatenate(bufs if bufs else [np.zeros(0)]).tofile(os.path.join(d, "ref_buffers.bin"))


if __name__ == "__main__":
    main()
