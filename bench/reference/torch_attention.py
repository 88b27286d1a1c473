#!/usr/bin/env python3
"""PyTorch's causal attention core on the GPU, the reference for
bench/gpu_attention.cpp: F.scaled_dot_product_attention(is_causal=True) on
q, k, v [N, H, T, hd] (PyTorch picks its fused FlashAttention-2 or
memory-efficient kernel), forward alone and forward + backward, in float32
(TF32 off) or bfloat16. Median milliseconds of CUDA-event-timed runs; prints
one JSON object on stdout."""
import argparse
import json
import statistics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(json.dumps({"error": f"PyTorch unavailable: {e}"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda is not available"}))
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (a.n, a.heads, a.tokens, a.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dt, generator=g).requires_grad_() for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=dt, generator=g)

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        torch.autograd.grad(fwd(), (q, k, v), do)

    def timed(f):
        for _ in range(3):
            f()
        ms = []
        for _ in range(a.iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            f()
            e.record()
            e.synchronize()
            ms.append(s.elapsed_time(e))
        return statistics.median(ms)

    with torch.no_grad():
        f_ms = timed(fwd)
    fb_ms = timed(fwd_bwd)
    print(json.dumps({"forward_ms": f_ms, "forward_backward_ms": fb_ms, "dtype": a.dtype,
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}))


if __name__ == "__main__":
    main()
