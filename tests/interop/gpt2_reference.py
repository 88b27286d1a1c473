#!/usr/bin/python3
"""GPT-2 written directly in PyTorch (Debian's python3-torch), independent of
ringtrain: its own safetensors reader and writer (struct + json + numpy), its
own model (Radford et al. 2019 / Hugging Face GPT2LMHeadModel semantics:
learned positions, pre-norm blocks, Conv1D weights [in, out], biases,
LayerNorm eps, tanh GELU, LM head tied to wte), computed in float64.

  gpt2_reference.py loss WEIGHTS TEST_H5 SEQ_LEN HEADS
      prints the mean next-token loss over every window of the test split
      (window i = tokens [i T, i T + T + 1), as ringtrain's loader cuts them)
      with the GELU and epsilon the file's metadata or config.json says, and
      the same with the other GELU (so a caller can see which one was used).
  gpt2_reference.py write OUT_DIR VOCAB WIDTH DEPTH HEADS POSITIONS SEED
      writes OUT_DIR/model.safetensors (GPT2Model's names: no "transformer."
      prefix, as the Hub's gpt2 file; lm_head and the attention masks absent)
      with random weights and biases, and OUT_DIR/config.json (gelu_new, 1e-5).
  gpt2_reference.py same A B
      exits 0 when safetensors files A and B hold the same names, dtypes,
      shapes and bytes (metadata aside).
WEIGHTS, A and B may be directories of shards (model.safetensors.index.json).
"""
import json
import math
import os
import struct
import sys

import h5py
import numpy as np
import torch

torch.set_num_threads(1)
DTYPES = {"F32": np.float32, "F64": np.float64}


def read_weights(path):
    """A safetensors file, or a directory of shards listed by model.safetensors.index.json."""
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.isdir(path):
        return read_safetensors(path)
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    out, meta = {}, {}
    for name in sorted(set(weight_map.values())):
        part, meta = read_safetensors(os.path.join(path, name))
        assert all(weight_map[k] == name for k in part), f"{name} holds tensors the index maps elsewhere"
        out.update(part)
    assert set(out) == set(weight_map), "the index lists tensors no shard holds"
    return out, meta


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        if e["dtype"] == "BF16":  # bfloat16: the upper half of a float32
            u = np.frombuffer(data[b:end], dtype="<u2").astype("<u4") << 16
            arr = u.view("<f4")
        else:
            arr = np.frombuffer(data[b:end], dtype=DTYPES[e["dtype"]])
        out[name] = (e["dtype"], arr.reshape(e["shape"]), data[b:end])
    return out, meta


def write_safetensors(path, tensors, meta):
    header, blobs, at = {"__metadata__": meta}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def settings(path, meta):
    """(gelu, eps) from the file's metadata, else config.json beside it; GPT-2's defaults otherwise."""
    cfg = dict(meta)
    cj = os.path.join(path if os.path.isdir(path) else os.path.dirname(path), "config.json")
    if "activation_function" not in cfg and os.path.exists(cj):
        with open(cj) as f:
            cfg = json.load(f)
    act = cfg.get("activation_function", "gelu_new")
    return ("tanh" if act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast") else "erf",
            float(cfg.get("layer_norm_epsilon", 1e-5)))


def gpt2_loss(w, tokens, seq_len, heads, gelu, eps):
    def p(name):  # GPT2LMHeadModel's or GPT2Model's name
        t = w.get("transformer." + name, w.get(name))
        return torch.from_numpy(np.array(t[1], dtype=np.float64))

    def ln(x, prefix):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], p(prefix + ".weight"), p(prefix + ".bias"), eps)

    def act(x):
        if gelu == "tanh":
            return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))

    depth = len({k.split(".")[-4] for k in w if ".attn.c_attn.weight" in k})
    n = (len(tokens) - 1) // seq_len
    idx = torch.tensor(np.stack([tokens[i * seq_len:i * seq_len + seq_len] for i in range(n)]).astype(np.int64))
    tgt = torch.tensor(np.stack([tokens[i * seq_len + 1:i * seq_len + seq_len + 1] for i in range(n)]).astype(np.int64))
    wte = p("wte.weight")
    x = wte[idx] + p("wpe.weight")[:seq_len]
    B, T, C = x.shape
    hd = C // heads
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(depth):
        h = f"h.{i}."
        qkv = ln(x, h + "ln_1") @ p(h + "attn.c_attn.weight") + p(h + "attn.c_attn.bias")
        q, k, v = (t.view(B, T, heads, hd).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p(h + "attn.c_proj.weight") + p(h + "attn.c_proj.bias")
        m = act(ln(x, h + "ln_2") @ p(h + "mlp.c_fc.weight") + p(h + "mlp.c_fc.bias"))
        x = x + m @ p(h + "mlp.c_proj.weight") + p(h + "mlp.c_proj.bias")
    logits = ln(x, "ln_f") @ wte.T  # the tied head
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1)).item()


def main(argv):
    if argv[0] == "loss":
        path, test, seq_len, heads = argv[1], argv[2], int(argv[3]), int(argv[4])
        w, meta = read_weights(path)
        with h5py.File(test, "r") as f:
            tokens = np.asarray(f["tokens"][:], dtype=np.int64)
        gelu, eps = settings(path, meta)
        other = "erf" if gelu == "tanh" else "tanh"
        print(f"{gpt2_loss(w, tokens, seq_len, heads, gelu, eps):.12g} {gelu} "
              f"{gpt2_loss(w, tokens, seq_len, heads, other, eps):.12g} {other}")
    elif argv[0] == "write":
        out, vocab, width, depth, heads, positions, seed = argv[1], *map(int, argv[2:8])
        rng = np.random.default_rng(seed)
        t = {"wte.weight": rng.normal(0, 0.3, (vocab, width)), "wpe.weight": rng.normal(0, 0.1, (positions, width))}
        shapes = {"attn.c_attn": (width, 3 * width), "attn.c_proj": (width, width), "mlp.c_fc": (width, 4 * width),
                  "mlp.c_proj": (4 * width, width)}
        for i in range(depth):
            for ln in ("ln_1", "ln_2"):
                t[f"h.{i}.{ln}.weight"] = 1 + rng.normal(0, 0.2, width)
                t[f"h.{i}.{ln}.bias"] = rng.normal(0, 0.2, width)
            for name, s in shapes.items():
                t[f"h.{i}.{name}.weight"] = rng.normal(0, 1 / math.sqrt(s[0]), s)
                t[f"h.{i}.{name}.bias"] = rng.normal(0, 0.1, s[1])
            t[f"h.{i}.attn.bias"] = np.tril(np.ones((positions, positions)))[None, None]  # the mask buffer
        t["ln_f.weight"] = 1 + rng.normal(0, 0.2, width)
        t["ln_f.bias"] = rng.normal(0, 0.2, width)
        os.makedirs(out, exist_ok=True)
        write_safetensors(os.path.join(out, "model.safetensors"), t, {"format": "pt"})
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump({"model_type": "gpt2", "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                       "n_embd": width, "n_layer": depth, "n_head": heads, "n_positions": positions,
                       "vocab_size": vocab}, f)
    elif argv[0] == "same":
        a, _ = read_weights(argv[1])
        b, _ = read_weights(argv[2])
        bad = [k for k in sorted(set(a) | set(b))
               if k not in a or k not in b or a[k][0] != b[k][0] or a[k][1].shape != b[k][1].shape or a[k][2] != b[k][2]]
        print(f"{len(a)} tensors, {len(bad)} differ" + (f": first {bad[0]}" if bad else ""))
        return 1 if bad else 0
    else:
        raise SystemExit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
