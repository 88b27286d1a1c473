#!/usr/bin/python3
"""PyTorch DDP (gloo) reference for bench/train_ddp_throughput.

Trains the same `cnn` (or `resnet`) as ringtrain on the same HDF5 data, with the
same per-rank batch, threads per rank and SGD settings, on `--ranks` processes
on this machine, and prints one JSON line: {"images_per_s": ..., ...}.
Run with Debian's python (/usr/bin/python3), which has torch and h5py.
"""
import argparse
import json
import os
import statistics
import sys
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402  (the same model definitions as the other references)


def worker(rank, args, out_q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(0)
    model = torch_models.build(args.model, 1, 28, 28, 10)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    with h5py.File(args.data, "r") as f:
        n = min(f["images"].shape[0], args.batch * args.ranks * (args.steps + args.warmup))
        imgs = f["images"][:n]
        labels = f["labels"][:n]
    x_all = torch.from_numpy(imgs.astype(np.float32) / 255.0)
    y_all = torch.from_numpy(labels.astype(np.int64))
    times = []
    step = 0
    for it in range(args.warmup + args.steps):
        lo = (it * args.ranks + rank) * args.batch % (n - args.batch + 1)
        x, y = x_all[lo:lo + args.batch], y_all[lo:lo + args.batch]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        t = time.perf_counter() - t0
        if it >= args.warmup:
            times.append(t)
        step += 1
    tt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
    if rank == 0:
        med = statistics.median(tt.tolist())
        out_q.put({"images_per_s": args.batch * args.ranks / med, "median_step_s": med,
                   "ranks": args.ranks, "batch_per_rank": args.batch, "threads": args.threads,
                   "model": args.model, "torch": torch.__version__})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--model", default="cnn", choices=["mlp", "cnn", "resnet"])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--port", type=int, default=29533)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, q)) for r in range(args.ranks)]
    for pr in procs:
        pr.start()
    res = q.get(timeout=600)
    for pr in procs:
        pr.join()
    print(json.dumps(res))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
