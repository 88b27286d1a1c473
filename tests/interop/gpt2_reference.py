#!/usr/bin/python3
"""GPT-2 written directly in PyTorch (Debian's python3-torch), independent of
ringtrain: its own safetensors reader and writer (struct + json + numpy), its
own model (Radford et al. 2019 / Hugging Face GPT2LMHeadModel semantics:
learned positions, pre-norm blocks, Conv1D weights [in, out], biases,
LayerNorm eps, tanh GELU, LM head tied to wte), computed in float64.

  gpt2_reference.py loss WEIGHTS TEST_H5 SEQ_LEN HEADS [VOCAB]
      prints the mean next-token loss over every window of the test split
      (window i = tokens [i T, i T + T + 1), as ringtrain's loader cuts them)
      with the GELU and epsilon the file's metadata or config.json says, and
      the same with the other GELU (so a caller can see which one was used).
      VOCAB > the file's wte rows: the model's vocabulary is padded with zero rows.
  gpt2_reference.py logits WEIGHTS TOKENS_I32 N T HEADS OUT
      writes the logits [N, T, V] (float64, raw) for the int32 tokens [N, T] in
      file TOKENS_I32 to OUT.tanh and OUT.erf (the two GELUs).
  gpt2_reference.py write OUT_DIR VOCAB WIDTH DEPTH HEADS POSITIONS SEED
      writes OUT_DIR/model.safetensors (GPT2Model's names: no "transformer."
      prefix, as the Hub's gpt2 file; lm_head and the attention masks absent)
      with random weights and biases, and OUT_DIR/config.json (gelu_new, 1e-5).
  gpt2_reference.py write-llmc OUT.bin VOCAB WIDTH DEPTH HEADS POSITIONS SEED VP
      the same weights as llm.c's float32 model file (wte padded to VP rows of 1e3:
      rows a reader must not use).
  gpt2_reference.py same A B
      exits 0 when safetensors files A and B hold the same names, dtypes,
      shapes and bytes (metadata aside).
WEIGHTS, A and B may be directories of shards (model.safetensors.index.json) or llm.c model files.
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


# llm.c's model file (train_gpt2.c): int32[256] header, then these tensors, each layer's stacked,
# weights [out, in] (nn.Linear); name in GPT-2's Conv1D naming, whether transposed, shape.
LLMC = [("wte.weight", False, "VpC"), ("wpe.weight", False, "TC"), ("ln_1.weight", False, "LC"),
        ("ln_1.bias", False, "LC"), ("attn.c_attn.weight", True, "L3C"), ("attn.c_attn.bias", False, "L3"),
        ("attn.c_proj.weight", True, "LCC"), ("attn.c_proj.bias", False, "LC"), ("ln_2.weight", False, "LC"),
        ("ln_2.bias", False, "LC"), ("mlp.c_fc.weight", True, "L4C"), ("mlp.c_fc.bias", False, "L4"),
        ("mlp.c_proj.weight", True, "LC4"), ("mlp.c_proj.bias", False, "LC"), ("ln_f.weight", False, "C"),
        ("ln_f.bias", False, "C")]


def llmc_shape(code, h):
    dims = {"Vp": h["Vp"], "T": h["T"], "L": h["L"], "C": h["C"], "3": 3 * h["C"], "4": 4 * h["C"]}
    out, i = [], 0
    while i < len(code):
        k = "Vp" if code.startswith("Vp", i) else code[i]
        out.append(dims[k])
        i += len(k)
    if code in ("L3", "L4"):  # biases: [L, 3C], [L, 4C]
        out = [h["L"], dims[code[1]]]
    return out


def read_llmc(path):
    """llm.c's model file as GPT-2's tensors (Conv1D layout; wte cut to V rows)."""
    with open(path, "rb") as f:
        raw = f.read()
    head = np.frombuffer(raw[:1024], dtype="<i4")
    assert head[0] == 20240326 and head[1] in (3, 5), f"{path}: not an llm.c model file"
    h = {"T": int(head[2]), "V": int(head[3]), "L": int(head[4]), "NH": int(head[5]), "C": int(head[6]),
         "Vp": int(head[7])}
    at, out = 1024, {}
    for name, conv1d, code in LLMC:
        shape = llmc_shape(code, h)
        n = int(np.prod(shape))
        if head[1] == 5:
            arr = (np.frombuffer(raw[at:at + 2 * n], dtype="<u2").astype("<u4") << 16).view("<f4")
            at += 2 * n
        else:
            arr = np.frombuffer(raw[at:at + 4 * n], dtype="<f4")
            at += 4 * n
        arr = arr.reshape(shape)
        layers = [(f"h.{i}.{name}", arr[i]) for i in range(h["L"])] if code.startswith("L") else [(name, arr)]
        for n_, a in layers:
            if conv1d:
                a = a.T
            if n_ == "wte.weight":
                a = a[:h["V"]]
            a = np.ascontiguousarray(a, dtype="<f4")
            out[n_] = ("F32", a, a.tobytes())
    assert at == len(raw), f"{path}: {len(raw)} bytes, the header says {at}"
    return out, {"activation_function": "gelu_new", "layer_norm_epsilon": "1e-5"}


def write_llmc(path, t, V, Vp, T, L, NH, C):
    """GPT-2 tensors t (Conv1D layout, GPT2Model names) as llm.c's float32 model file; wte padded to Vp
    rows with values that must not be read (llm.c writes zeros there)."""
    head = np.zeros(256, dtype="<i4")
    head[:8] = [20240326, 3, T, V, L, NH, C, Vp]
    blobs = [head.tobytes()]
    for name, conv1d, code in LLMC:
        if code.startswith("L"):
            arr = np.stack([t[f"h.{i}.{name}"].T if conv1d else t[f"h.{i}.{name}"] for i in range(L)])
        elif name == "wte.weight":
            arr = np.concatenate([t[name], np.full((Vp - V, C), 1e3)])
        else:
            arr = t[name]
        assert list(arr.shape) == llmc_shape(code, {"T": T, "L": L, "C": C, "Vp": Vp}), name
        blobs.append(np.ascontiguousarray(arr, dtype="<f4").tobytes())
    with open(path, "wb") as f:
        f.write(b"".join(blobs))


def read_weights(path):
    """A safetensors file, a directory of shards listed by model.safetensors.index.json, or an llm.c
    model file."""
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            magic = f.read(4)
        if np.frombuffer(magic, dtype="<i4")[0] == 20240326:
            return read_llmc(path)
        return read_safetensors(path)
    if not os.path.exists(index):
        return read_safetensors(os.path.join(path, "model.safetensors"))
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


def gpt2_logits(w, idx, heads, gelu, eps):
    """GPT-2's logits [B, T, V] for token ids idx [B, T] (int64 tensor), in float64."""
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
    wte = p("wte.weight")
    x = wte[idx] + p("wpe.weight")[:idx.shape[1]]
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
    return ln(x, "ln_f") @ wte.T  # the tied head


def gpt2_loss(w, tokens, seq_len, heads, gelu, eps):
    n = (len(tokens) - 1) // seq_len
    idx = torch.tensor(np.stack([tokens[i * seq_len:i * seq_len + seq_len] for i in range(n)]).astype(np.int64))
    tgt = torch.tensor(np.stack([tokens[i * seq_len + 1:i * seq_len + seq_len + 1] for i in range(n)]).astype(np.int64))
    logits = gpt2_logits(w, idx, heads, gelu, eps)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1)).item()


def main(argv):
    if argv[0] == "loss":
        path, test, seq_len, heads = argv[1], argv[2], int(argv[3]), int(argv[4])
        w, meta = read_weights(path)
        if len(argv) > 5:  # a padded vocabulary: zero rows after the file's
            key = "transformer.wte.weight" if "transformer.wte.weight" in w else "wte.weight"
            wte = w[key][1]
            pad = np.zeros((int(argv[5]) - wte.shape[0], wte.shape[1]), dtype=wte.dtype)
            w[key] = (w[key][0], np.concatenate([wte, pad]), None)
        with h5py.File(test, "r") as f:
            tokens = np.asarray(f["tokens"][:], dtype=np.int64)
        gelu, eps = settings(path, meta)
        other = "erf" if gelu == "tanh" else "tanh"
        print(f"{gpt2_loss(w, tokens, seq_len, heads, gelu, eps):.12g} {gelu} "
              f"{gpt2_loss(w, tokens, seq_len, heads, other, eps):.12g} {other}")
    elif argv[0] == "logits":
        path, tokens, n, t, heads, out = argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5]), argv[6]
        w, meta = read_weights(path)
        idx = torch.tensor(np.fromfile(tokens, dtype="<i4").astype(np.int64).reshape(n, t))
        gelu, eps = settings(path, meta)
        for g in (gelu, "erf" if gelu == "tanh" else "tanh"):  # the file's GELU, then the other
            with open(out + "." + g, "wb") as f:
                f.write(gpt2_logits(w, idx, heads, g, eps).numpy().astype("<f8").tobytes())
    elif argv[0] in ("write", "write-llmc"):
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
        if argv[0] == "write-llmc":
            for k in [k for k in t if k.endswith(".attn.bias") and ".c_" not in k]:
                del t[k]  # the mask buffers: llm.c has none
            write_llmc(out, t, vocab, int(argv[8]), positions, depth, heads, width)
            return 0
        os.makedirs(out, exist_ok=True)
        write_safetensors(os.path.join(out, "model.safetensors"), t, {"format": "pt"})
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump({"model_type": "gpt2", "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                       "n_embd": width, "n_layer": depth, "n_head": heads, "n_positions": positions,
                       "vocab_size": vocab}, f)
    elif argv[0] == "same":
        def named(path):  # GPT2Model's names: without "transformer."
            w, _ = read_weights(path)
            return {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in w.items()}

        a, b = named(argv[1]), named(argv[2])
        bad = [k for k in sorted(set(a) | set(b))
               if k not in a or k not in b or a[k][0] != b[k][0] or a[k][1].shape != b[k][1].shape or a[k][2] != b[k][2]]
        print(f"{len(a)} tensors, {len(bad)} differ" + (f": first {bad[0]}" if bad else ""))
        return 1 if bad else 0
    else:
        raise SystemExit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
