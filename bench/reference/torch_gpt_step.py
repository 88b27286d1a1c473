#!/usr/bin/python3
"""PyTorch side of bench_nn_gpt_vs_pytorch: seconds per training step (forward,
per-token cross-entropy, backward, plain SGD) of the gpt of torch_models.py
(token + learned position embedding, pre-LN causal blocks, GELU MLP, final
LayerNorm, LM head tied to the embedding; scaled_dot_product_attention where
this torch has it) on synthetic tokens, at the shape and thread count ringtrain
runs. Prints one JSON object on the last line of stdout: medians by wall clock
and by process CPU time (steadier on a shared machine)."""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--mlp-ratio", type=float, default=4.0)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--autocast", choices=["fp32", "bf16"], default="fp32",
                    help='bf16: forward under torch.autocast("cpu", torch.bfloat16)')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = torch_models.build("gpt", 1, 1, 1, a.vocab, a.depth, a.width, a.heads, a.mlp_ratio, seq_len=a.seq)
    with torch.no_grad():  # the embeddings as ringtrain draws them (the zoo's start at zero)
        torch.nn.init.normal_(m.wte.weight, 0.0, 0.02)
        torch.nn.init.normal_(m.wte.pos_embed, 0.0, 0.02)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).float()  # ids as floats, as ringtrain's batch
    y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    times, cpu = [], []
    for it in range(a.warmup + a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = F.cross_entropy(m(x).reshape(-1, a.vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        t, c = time.perf_counter() - t0, time.process_time() - c0
        if it >= a.warmup:
            times.append(t)
            cpu.append(c)
    times.sort()
    cpu.sort()
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "autocast": a.autocast,
                      "threads": torch.get_num_threads(), "sdpa": hasattr(F, "scaled_dot_product_attention"),
                      "params": sum(p.numel() for p in m.parameters()), "loss": float(loss),
                      "median_s": times[len(times) // 2], "cpu_median_s": cpu[len(cpu) // 2]}))


if __name__ == "__main__":
    main()
