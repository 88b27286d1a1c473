#!/usr/bin/python3
"""SMPI-simulated all-reduce times of ringtrain's ring and tree vs jobs/costmodel.py's formulas.
   compare.py RAW.csv OUTDIR --gbit G --lat-us L --ppn Q --shm-gbyte S --shm-lat-us SL
RAW lines: network_model,ranks,algorithm,bytes,time_us (from jobs/smpi/run.sh)."""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import costmodel as cm  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("raw"); ap.add_argument("out")
ap.add_argument("--gbit", type=float, required=True); ap.add_argument("--lat-us", type=float, required=True)
ap.add_argument("--ppn", type=int, required=True)
ap.add_argument("--shm-gbyte", type=float, required=True); ap.add_argument("--shm-lat-us", type=float, required=True)
a = ap.parse_args()
# A message between nodes crosses two cluster links (node -> backbone -> node): 2 latencies.
net = {"alpha": 2 * a.lat_us * 1e-6, "beta": cm.gbit_to_beta(a.gbit)}
shm = {"alpha": a.shm_lat_us * 1e-6, "beta": 1 / (a.shm_gbyte * 1e9)}
rows = []
for line in open(a.raw):
    f = line.strip().split(",")
    if len(f) != 5:
        continue
    model, p, algo, n, us = f[0], int(f[1]), f[2], int(f[3]), float(f[4])
    q = min(a.ppn, p)
    c = cm.Cluster((p + q - 1) // q, q, shm, net, 0.0)
    pred = cm.t_allreduce(n, c, algo) * 1e6
    rows.append({"network_model": model, "ranks": p, "nodes": c.m, "algorithm": algo, "bytes": n,
                 "simulated_us": us, "model_us": pred, "model_vs_sim": pred / us - 1})
with open(os.path.join(a.out, "smpi.csv"), "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()) if rows else ["empty"])
    w.writeheader(); w.writerows(rows)
L = [f"SMPI ({a.ppn} ranks/node, {a.gbit:g} Gbit/s links, {a.lat_us:g} us per link, loopback {a.shm_gbyte:g} GB/s "
     f"{a.shm_lat_us:g} us) vs cost model (alpha_net = 2 link latencies, gamma = 0: computation not simulated)",
     f"{'net model':<9} {'ranks':>5} {'algo':<5} {'bytes':>8} {'SMPI us':>10} {'model us':>10} {'model/SMPI-1':>12}"]
for r in rows:
    L.append(f"{r['network_model']:<9} {r['ranks']:>5} {r['algorithm']:<5} {r['bytes']:>8} {r['simulated_us']:>10.1f} "
             f"{r['model_us']:>10.1f} {r['model_vs_sim'] * 100:>11.1f}%")
for m in ("ab", "smpi"):
    e = sorted(abs(r["model_vs_sim"]) for r in rows if r["network_model"] == m)
    if e:
        L.append(f"{m}: median |model/SMPI - 1| {e[len(e) // 2] * 100:.1f}%, within 15%: {sum(x <= 0.15 for x in e)}/{len(e)}")
open(os.path.join(a.out, "smpi.txt"), "w").write("\n".join(L) + "\n")
print("\n".join(L))
