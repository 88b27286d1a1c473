#!/usr/bin/python3
"""PyTorch reference for tests/nn/optim_torch.cpp.

Runs torch.optim.SGD / Adam / AdamW (single-tensor path, foreach=False) for
STEPS steps on deterministic parameters and gradients, and writes
  <out>/manifest.json  the cases: config, dtype, parameter shapes/decay flags,
                       per-step learning rates, and where each result lies
  <out>/<case>.bin     raw little-endian values: for every parameter in order,
                       the final parameter, then each state buffer (torch names)

Inputs are exact binary fractions from an integer formula that the C++ test
evaluates identically (value() below and rt_value() there must agree):
  value(pid, i, step, salt) = ((i·7919 + pid·613 + step·104729 + salt·31337) mod 2001 − 1000) / 1024
Parameters use step = 0, salt = 1; the gradient of step s (0-based) uses step = s + 1, salt = 2.
Parameters with decay = False form a second param group with weight_decay = 0,
which is ringtrain's default treatment of ParamInfo.decay.
Usage: /usr/bin/python3 optim_reference.py OUT_DIR
"""
import json
import os
import sys

import torch

STEPS = 5
# name, shape, decay; "big" exceeds the optimizers' parallel threshold (65,536).
PARAMS = [("weight", [3, 5], True), ("bias", [5], False), ("big", [300, 300], True)]
BASE_LR = {"sgd": 0.1, "adam": 0.01, "adamw": 0.01}

CASES = [
    dict(name="sgd_plain", opt="sgd", dtype="float32"),
    dict(name="sgd_momentum_dampening_wd", opt="sgd", dtype="float32", momentum=0.9, dampening=0.1,
         weight_decay=0.01),
    dict(name="sgd_nesterov_wd", opt="sgd", dtype="float32", momentum=0.9, nesterov=True, weight_decay=5e-4),
    dict(name="adam", opt="adam", dtype="float32"),
    dict(name="adam_l2", opt="adam", dtype="float32", weight_decay=0.01, beta1=0.8, beta2=0.99),
    dict(name="adamw", opt="adamw", dtype="float32", weight_decay=0.05, beta1=0.85, beta2=0.99, eps=1e-6),
    dict(name="sgd_nesterov_f64", opt="sgd", dtype="float64", momentum=0.9, nesterov=True, weight_decay=1e-3),
    dict(name="adamw_f64", opt="adamw", dtype="float64", weight_decay=0.1),
]


def value(pid, n, step, salt, dtype):
    i = torch.arange(n, dtype=torch.int64)
    k = (i * 7919 + pid * 613 + step * 104729 + salt * 31337) % 2001 - 1000
    return (k.to(torch.float64) / 1024.0).to(dtype)


def run_case(case, out_dir):
    dtype = getattr(torch, case["dtype"])
    params = []
    for pid, (_, shape, _) in enumerate(PARAMS):
        n = 1
        for d in shape:
            n *= d
        params.append(value(pid, n, 0, 1, dtype).reshape(shape).clone().requires_grad_(True))
    wd = case.get("weight_decay", 0.0)
    groups = [dict(params=[p for p, (_, _, dec) in zip(params, PARAMS) if dec], weight_decay=wd),
              dict(params=[p for p, (_, _, dec) in zip(params, PARAMS) if not dec], weight_decay=0.0)]
    opt = case["opt"]
    lr0 = BASE_LR[opt]
    if opt == "sgd":
        o = torch.optim.SGD(groups, lr=lr0, momentum=case.get("momentum", 0.0), dampening=case.get("dampening", 0.0),
                            nesterov=case.get("nesterov", False), foreach=False)
        state_names = ["momentum_buffer"] if case.get("momentum", 0.0) != 0 else []
    else:
        cls = torch.optim.Adam if opt == "adam" else torch.optim.AdamW
        o = cls(groups, lr=lr0, betas=(case.get("beta1", 0.9), case.get("beta2", 0.999)), eps=case.get("eps", 1e-8),
                foreach=False)
        state_names = ["exp_avg", "exp_avg_sq"]
    lrs = []
    for s in range(STEPS):
        lr = lr0 * (1.0 - 0.1 * s)  # a changing lr: the C++ side passes it to step(lr)
        lrs.append(lr)
        for g in o.param_groups:
            g["lr"] = lr
        for pid, p in enumerate(params):
            p.grad = value(pid, p.numel(), s + 1, 2, dtype).reshape(p.shape)
        o.step()
    blobs = []
    for p in params:
        blobs.append(p.detach().reshape(-1))
        for sn in state_names:
            blobs.append(o.state[p][sn].reshape(-1))
    data = torch.cat(blobs).contiguous()
    with open(os.path.join(out_dir, case["name"] + ".bin"), "wb") as f:
        f.write(data.numpy().tobytes())
    entry = dict(case)
    entry.update(lrs=lrs, state_names=state_names, numel=data.numel())
    return entry


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    manifest = dict(steps=STEPS, torch=torch.__version__,
                    params=[dict(name=n, shape=s, decay=d) for n, s, d in PARAMS],
                    cases=[run_case(c, out_dir) for c in CASES])
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
