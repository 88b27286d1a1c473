#!/usr/bin/env python3
"""PyTorch eager training-step time on the GPU, the reference for
bench/gpu_train_step.cpp: the same model (torch_models.build, shared with the
CPU throughput reference), batch, SGD(momentum) and loss (gpt: per-token
cross-entropy on random ids, attention through scaled_dot_product_attention):
fp32 (TF32 off),
tf32 (TF32 on), bf16 (autocast, fp32 master weights) or fp16 (autocast and
GradScaler). Prints one JSON object on stdout."""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_args  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    model_args.add_model_args(ap)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    try:
        import torch
        import torch_models
    except ImportError as e:
        print(json.dumps({"error": f"PyTorch unavailable: {e}"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda is not available"}))
        return
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = model_args.build_model(torch_models, a).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    if a.model == "gpt":
        x = torch.randint(0, a.classes, (a.batch, a.seq_len), device=dev)
        y = torch.randint(0, a.classes, (a.batch * a.seq_len,), device=dev)
    else:
        x = torch.randn(a.batch, a.in_channels, a.size, a.size, device=dev)
        y = torch.randint(0, a.classes, (a.batch,), device=dev)

    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=a.precision == "fp16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None):
            z = model(x)
            loss = loss_fn(z.reshape(-1, z.shape[-1]), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        loss = step()
        loss.item()  # one host sync per step, as ringtrain's loss read-back
        times.append(time.perf_counter() - t0)
    print(json.dumps({"model": a.model, "batch": a.batch, "precision": a.precision,
                      "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}))


if __name__ == "__main__":
    main()
