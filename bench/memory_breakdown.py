#!/usr/bin/env python3
"""Which tensors a vit rank holds at its peak, per transformer block, side by side.

  bench/memory_breakdown.py DEPTH TOKENS NAME=FILE@T@B [NAME=FILE@T@B ...]

T: the run's tensor size, B: its samples per micro-batch. Each FILE is what `bench_parallel_memory --breakdown` wrote for one rank:
bytes live at the rank's peak per allocating site and size. Sites are named
here by the tensor they allocate in vit's pre-norm block (norm1, attn (qkv,
core, proj), norm2, fc1, GELU, fc2, the residual sums), from the site and the
size; a named site with a multiple of DEPTH tensors is "per block" (MiB per
block), the others are printed once (MiB in all) under their site.
"""
import csv
import re
import sys

H, A = 512, 8  # vit in bench_parallel_memory: width, heads


def name(site, each, t, D, P):
    """The tensor a (site, size) holds in vit's block, at tensor size t; D: bytes of whole
    [b, s, h] tokens, P: of this rank's attention scores [b, a/t, s, s]; None: not a block's."""
    site = re.sub(r"^Storage::Storage < ", "", site)
    is_ = lambda x: abs(each - x) < 1
    first = site.split(" < ")[0]
    under = site.split(" < ")[1] if " < " in site else ""
    if first == "Linear::do_forward" and under.startswith("RowParallel"):
        return "row layer's local output: whole-token partial products (proj, fc2)"
    if first == "Linear::run_backward" and "do_backward_input" in site:
        return "column layer's local dx: whole tokens (qkv, fc1)"
    if first.startswith("Linear::") and not re.search(r"ResidualStack|MultiHead|ColumnParallel|RowParallel", site):
        return None  # the patch embedding's or the head's
    if first == "Linear::do_forward":
        if is_(3 * D / t): return "qkv output (Q, K, V)"
        if is_(4 * D / t): return "fc1 output (GELU input)"
        if is_(D) and t == 1: return "proj output" if "MultiHead" in site else "fc2 output"
    if first == "Linear::run_backward":
        if is_(4 * D / t): return "fc2 dx (GELU output grad)"
        if is_(D) and t == 1: return "qkv dx + proj dx" if "MultiHead" in site else "fc1 dx"
        if is_(D / t): return "proj dx (core grad)"
    if first == "Activation::do_forward": return "GELU output (fc2 input)"
    if first == "Activation::do_backward": return "GELU dx"
    if first == "MultiHeadSelfAttention::do_forward":
        if is_(P): return "attention softmax output"
        if is_(D / t): return "attention core output (proj input)"
    if first == "MultiHeadSelfAttention::do_backward":
        if is_(P): return "attention d scores (kernel workspace)"
        if is_(3 * D / t): return "attention d qkv"
    if first == "LayerNorm::do_forward" and under.startswith("ResidualStack"): return "norm1, norm2 outputs"
    if first == "LayerNorm::do_backward" and under.startswith("ResidualStack"): return "norm1, norm2 dx"
    if first == "RowParallel::do_forward": return "row layer's reduced output z (proj, fc2)"
    if first == "ResidualStack::do_forward": return "residual sums (x + attn, block output)"
    if first == "ResidualStack::do_backward": return "residual dx"
    return None


def load(path, depth, t, tokens, b):
    D, P = tokens * b * H * 4, b * A // t * tokens * tokens * 4
    per_block, once = {}, {}
    for r in csv.DictReader(open(path)):
        each, count, site = int(r["bytes_each"]), int(r["count"]), r["site"]
        n = name(site, each, t, D, P)
        if n and count >= depth:  # one or more per block; the rest (a first or last block's) once
            per_block[n] = per_block.get(n, 0) + each * (count // depth)
            count %= depth
        if count:
            k = f"{n} (not per block)" if n else re.sub(r"^Storage::Storage < ", "", site)
            once[k] = once.get(k, 0) + each * count
    return per_block, once


def main():
    depth, tokens = int(sys.argv[1]), int(sys.argv[2])
    data = []
    for a in sys.argv[3:]:
        n, spec = a.split("=", 1)
        path, t, b = spec.split("@")
        data.append((n, *load(path, depth, int(t), tokens, int(b))))
    mib = 2**20
    print("per block (MiB)")
    keys = sorted({k for _, pb, _ in data for k in pb})
    print(f"{'tensor':69} " + " ".join(f"{n:>14}" for n, _, _ in data))
    for k in keys:
        print(f"{k[:69]:69} " + " ".join(f"{pb.get(k, 0) / mib:14.2f}" for _, pb, _ in data))
    print(f"{'sum per block':69} " + " ".join(f"{sum(pb.values()) / mib:14.2f}" for _, pb, _ in data))
    print(f"\nonce (MiB)")
    keys = sorted({k for _, _, o in data for k in o}, key=lambda k: -max(o.get(k, 0) for _, _, o in data))
    for k in keys:
        if max(o.get(k, 0) for _, _, o in data) < 0.5 * mib:
            continue
        print(f"{k[:69]:69} " + " ".join(f"{o.get(k, 0) / mib:14.2f}" for _, _, o in data))
    print(f"{'sum once':69} " + " ".join(f"{sum(o.values()) / mib:14.2f}" for _, _, o in data))
    print(f"{'total':69} " + " ".join(f"{(sum(o.values()) + depth * sum(pb.values())) / mib:14.2f}"
                                      for _, pb, o in data))


if __name__ == "__main__":
    main()
