# The MoE layer of nn/moe.hpp in PyTorch (float64), for tests/nn/moe_layer.cpp:
# reads cfg.json and float32 .bin tensors from DIR, writes y, aux and the
# gradients of J = sum(y * r) + coeff * aux as float64 .bin files.
#   /usr/bin/python3 moe_reference.py DIR
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

d = sys.argv[1]
c = json.load(open(f"{d}/cfg.json"))
n, D, H, E, k = c["n"], c["dim"], c["hidden"], c["experts"], c["top_k"]


def read(name, shape):
    a = np.fromfile(f"{d}/{name}.bin", dtype=np.float32).reshape(shape)
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


x, r, wr = read("x", (n, D)), read("r", (n, D)), read("router", (E, D))
w1 = [read(f"w1_{e}", (H, D)) for e in range(E)]
b1 = [read(f"b1_{e}", (H,)) for e in range(E)]
w2 = [read(f"w2_{e}", (D, H)) for e in range(E)]
b2 = [read(f"b2_{e}", (D,)) for e in range(E)]

p = torch.softmax(x @ wr.T, dim=-1)
top_p, top_i = torch.topk(p, k, dim=-1)
gates = top_p / top_p.sum(dim=-1, keepdim=True)
y = torch.zeros(n, D, dtype=torch.float64)
for e in range(E):
    tok, slot = (top_i == e).nonzero(as_tuple=True)
    if len(tok) == 0:
        continue
    o = F.gelu(x[tok] @ w1[e].T + b1[e]) @ w2[e].T + b2[e]
    y = y.index_add(0, tok, gates[tok, slot].unsqueeze(1) * o)
f = torch.bincount(top_i.flatten(), minlength=E).double() / (n * k)
aux = E * (f * p.mean(dim=0)).sum()
((y * r).sum() + c["coeff"] * aux).backward()

out = {"y": y, "aux": aux.reshape(1), "dx": x.grad, "drouter": wr.grad}
for e in range(E):
    out[f"dw1_{e}"], out[f"db1_{e}"], out[f"dw2_{e}"], out[f"db2_{e}"] = w1[e].grad, b1[e].grad, w2[e].grad, b2[e].grad
for name, t in out.items():
    t.detach().numpy().astype(np.float64).tofile(f"{d}/out_{name}.bin")
