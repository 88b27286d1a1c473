#!/usr/bin/env python3
"""Prints bench/parallel_memory.sh's table from bench_parallel_memory's CSV rows.

  bench/memory_formula.py CSV

Per run (model, layout, train.recompute) the largest rank's peak RSS, its
parameter + gradient + optimizer bytes and its activation bytes (host tensor
peak minus that state), each against the 1-rank run with recompute none,
beside the ideal: 1/(PP*TP) or the ZeRO formula for the state, and for vit's
activations Korthikanti et al. (2022)'s per-layer formula in the form that
applies to ringtrain's blocks (act_formula below).  Then the step time against
the same layout's recompute = none run, and for the ZeRO rows the bytes sent per
step against the ring all-reduce's.
"""
import csv
import sys

# vit as bench_parallel_memory builds it: width, depth, heads; global batch.
H, L, A, BATCH = 512, 8, 8, 32


def act_formula(tokens, dp, pp, tp, sp, mode):
    """Activation bytes per rank of vit's transformer layers, from Korthikanti et al.

    The paper counts, per layer, the bytes the backward reads, at 16 bits with
    1-byte dropout masks: sbh(34 + 5as/h). ringtrain keeps fp32 (4 bytes) and
    vit has no dropout (model.dropout = 0), so no masks and no dropout outputs.
    Counted in fp32 elements per layer: the two LayerNorm inputs (2 sbh), the
    qkv input (sbh), Q, K, V (3 sbh), the projection input (sbh), the fc1
    input (sbh), the GELU input and the fc2 input (4 + 4 sbh): 16 sbh, and the
    softmax output a s^2 b = sbh * as/h.  Bytes per layer:
      1 rank                      4 sbh (16 + as/h)
      tensor t                    4 sbh (4 + 12/t + as/(h t))     (LayerNorms, qkv and fc1 inputs whole)
      tensor t + sequence         4 sbh/t (16 + as/h)
      recompute = attention       the as/h term dropped (the softmax output is recomputed)
      recompute = block           4 sbh, or 4 sbh/t with sequence: the block input only, plus
                                  once the none form of the one layer being recomputed
    A pipeline stage holds L/PP layers and, under 1F1B with PP micro-batches
    (the default), PP micro-batches of b/PP samples in flight: L sbh/PP on the
    first stage. Data parallelism (ZeRO rows) divides b.
    """
    b = BATCH / dp / pp  # one micro-batch
    sbh = tokens * b * H
    att = A * tokens * tokens * b
    t = tp

    def layer(m):  # fp32 elements one layer keeps for one micro-batch
        if m == "block":
            return sbh / t if sp else sbh
        if sp:
            return (16 * sbh + (att if m == "none" else 0)) / t
        return 4 * sbh + 12 * sbh / t + (att / t if m == "none" else 0)

    # block: plus the one layer whose forward the backward is repeating (the paper leaves it out)
    return 4 * layer(mode) * (L / pp) * pp + (4 * layer("none") if mode == "block" else 0)


def main(path):
    rows = list(csv.DictReader(open(path)))
    for r in rows:
        r.setdefault("recompute", "none")
        r["recompute"] = r.get("recompute") or "none"
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"CPU: {cpu}; CSV: {path}")
    print("x 1 rank: against the 1-rank run with recompute none. state: parameters + gradients + optimizer.")
    print("act formula (vit): Korthikanti et al. 2022 per layer, fp32 and no dropout: 4sbh(16 + as/h) at 1 rank,")
    print("  4sbh(4 + 12/t + as/(ht)) at tensor t, 4sbh/t(16 + as/h) with sequence, no as/h term with recompute")
    print("  attention, 4sbh (4sbh/t with sequence) with recompute block plus one layer's none form (the one being")
    print("  recomputed); L/PP layers x PP micro-batches of b/PP on the first stage.")
    held = lambda r: float(r["params_b"]) + float(r["grads_b"]) + float(r["optimizer_b"])
    act = lambda r: float(r["activations_b"])
    modes = ["none", "attention", "block"]
    print(f"{'model':6} {'layout':22} {'recompute':9} {'peak RSS MB':>11} {'x 1 rank':>8} {'state MB':>9} {'x 1 rank':>8} "
          f"{'ideal':>6} {'act MB':>8} {'x 1 rank':>8} {'formula':>7} {'step s':>7} {'x none':>6}")
    for model in sorted({r["model"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["model"] == model]
        base = [r for r in mine if r["ranks"] == "1" and r["recompute"] == "none"]
        if not base:
            print(f"{model}: no 1-rank run with recompute none; skipped")
            continue
        base = base[0]
        tokens = int(base.get("tokens") or 0)
        f_base = act_formula(tokens, 1, 1, 1, False, "none") if model == "vit" and tokens else 0
        keyof = lambda r: (r["ranks"], r["pipeline"], r["tensor"], r["zero"], r.get("sequence", "0"))
        order = lambda k: (int(k[0]), int(k[1]) * int(k[2]) == 1, k[1], k[2], k[3], k[4])
        for key in sorted({keyof(r) for r in mine}, key=order):
            n, pp, tp, z, sp = int(key[0]), int(key[1]), int(key[2]), int(key[3]), key[4] == "1"
            dp = n // (pp * tp)
            if n == 1:
                name = "1 rank"
            elif pp * tp == 1:
                name = f"ZeRO-{z} over {dp}" if z else f"data {dp}"
            else:
                name = f"PP {pp} x TP {tp}" + (" + sequence" if sp else "") + (f" x DP {dp}" if dp > 1 else "")
            P, G, O = (float(base[k]) for k in ("params_b", "grads_b", "optimizer_b"))
            if pp * tp == 1 and dp > 1:
                ideal = ((P + G + O / dp) if z == 1 else (P + (G + O) / dp) if z == 2 else
                         (P + G + O) / dp if z == 3 else (P + G + O)) / held(base)
            else:
                ideal = 1 / (pp * tp)
            for mode in modes:
                rs = [r for r in mine if keyof(r) == key and r["recompute"] == mode]
                if not rs:
                    continue
                top = max(rs, key=lambda r: float(r["peak_rss_mb"]))
                big = max(rs, key=held)
                ab = max(rs, key=act)
                f = (f"{act_formula(tokens, dp, pp, tp, sp, mode) / f_base:7.3f}" if f_base else f"{'-':>7}")
                step = max(float(r["step_s"]) for r in rs)
                none = [r for r in mine if keyof(r) == key and r["recompute"] == "none"]
                step0 = max(float(r["step_s"]) for r in none) if none else 0
                cost = f"{step / step0:6.2f}" if step0 > 0 and step > 0 and mode != "none" else f"{'':>6}"
                extra = ""
                if z in (2, 3):
                    extra += f"  + buckets in flight {float(big['grads_in_flight_b']) / 2**20:.2f} MB"
                if z == 3:
                    extra += f"  + gathered layers in flight {float(big.get('params_in_flight_b') or 0) / 2**20:.2f} MB"
                print(f"{model:6} {name:22} {mode:9} {float(top['peak_rss_mb']):11.0f} "
                      f"{float(top['peak_rss_mb']) / float(base['peak_rss_mb']):8.3f} {held(big) / 2**20:9.1f} "
                      f"{held(big) / held(base):8.3f} {ideal:6.3f} {act(ab) / 2**20:8.1f} {act(ab) / act(base):8.3f} "
                      f"{f} {step:7.2f} {cost}{extra}")
        zr = [r for r in mine if r["pipeline"] == "1" and r["tensor"] == "1" and r["ranks"] != "1"
              and r["recompute"] == "none" and float(r["sent_per_step_b"]) > 0]
        if not zr:
            continue
        print(f"{model}: bytes sent per step by the largest sender (comm.algorithm = ring) against 2(N-1)/N x G "
              f"(ZeRO-3: 3(N-1)/N x G):")
        G = float(base["grads_b"])
        for n in sorted({r["ranks"] for r in zr}, key=int):
            dp0 = None
            for z in ("0", "1", "2", "3"):
                rs = [r for r in zr if (r["ranks"], r["zero"]) == (n, z)]
                if not rs:
                    continue
                sent = max(float(r["sent_per_step_b"]) for r in rs)
                dp0 = sent if z == "0" else dp0
                formula = (3 if z == "3" else 2) * (int(n) - 1) / int(n) * G
                print(f"  {n} ranks ZeRO-{z}: {sent / 2**20:9.3f} MB  formula {formula / 2**20:9.3f} MB  "
                      f"x formula {sent / formula:6.3f}" + (f"  x plain data parallelism {sent / dp0:6.3f}" if dp0 else ""))


if __name__ == "__main__":
    main(sys.argv[1])
