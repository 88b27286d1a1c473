#!/usr/bin/python3
"""PyTorch side of bench_nn_throughput: images/s of forward + backward + plain
SGD step on synthetic data, same model, batch and thread count as ringtrain.
Prints one JSON object on the last line of stdout, with medians by wall clock
and by process CPU time (steadier on a shared machine)."""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_args  # noqa: E402
import torch_models  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    model_args.add_model_args(ap)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--autocast", choices=["fp32", "bf16"], default="fp32",
                    help='bf16: forward under torch.autocast("cpu", torch.bfloat16)')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = model_args.build_model(torch_models, a)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(a.batch, a.in_channels, a.size, a.size)
    y = torch.randint(0, a.classes, (a.batch,))
    times, cpu = [], []
    for it in range(a.warmup + a.iters):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        t, c = time.perf_counter() - t0, time.process_time() - c0
        if it >= a.warmup:
            times.append(t)
            cpu.append(c)
    times.sort()
    cpu.sort()
    med = times[len(times) // 2]
    cmed = cpu[len(cpu) // 2]
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "model": a.model, "batch": a.batch,
                      "autocast": a.autocast,
                      "threads": torch.get_num_threads(), "median_s": med, "images_per_s": a.batch / med,
                      "cpu_median_s": cmed, "cpu_images_per_s": a.batch / cmed,
                      "mkldnn": torch.backends.mkldnn.is_available()}))


if __name__ == "__main__":
    main()
