#!/usr/bin/env python3
"""Per-run ratios of bench/pipeline_schedules.sh output: 1F1B against its bound (m/(m+p-1) x data 2, m = 4, p = 2),
each schedule against 1F1B by the epoch's rate and by the steady step, and each row's error against the per-step prediction;
from session 11's columns on also the median step against 1F1B's, its error against the median per-step play, and the
mean step against the busiest rank's compute (no table of that cut runs faster).
  bench/pipeline_ratios.py OUTPUT.txt"""
import sys, collections
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    f = line.split()
    if not f or f[0].startswith('#') or not f[0].isdigit() or len(f) < 5: continue
    r, m, lay = f[0], f[1], f[2]
    rate = float(f[4]); ms = float(f[6]) if len(f) > 7 and f[6] != '-' else None
    pred = float(f[10]) if len(f) > 11 else None
    # median step, median per-step play, busiest rank (runs from session 11 on)
    med = (float(f[11]), float(f[12]), float(f[13])) if len(f) > 14 else None
    rows[(r, m)][lay] = (rate, ms, pred, f[-1], med)
for (r, m), d in rows.items():
    s = f"run {r} {m:12}"
    if 'data2' in d and '1f1b' in d:
        s += f" 1f1b/bound {d['1f1b'][0] / (0.8 * d['data2'][0]):.2f}"
    if '1f1b' in d:
        b = d['1f1b']
        parts = []
        for lay in ('zb-h1', 'interleaved', 'zb-v'):
            if lay in d:
                x = d[lay]
                parts.append(f"{lay} rate {x[0]/b[0]:.2f} step {b[1]/x[1]:.2f} {x[3]}")
        s += " | " + "; ".join(parts)
        best = max(b[1]/d[l][1] for l in d if l not in ('data2','1f1b'))
        bestr = max(d[l][0]/b[0] for l in d if l not in ('data2','1f1b'))
        s += f" | best/1f1b step {best:.2f} rate {bestr:.2f}"
    errs = [f"{l} {d[l][1]/d[l][2]-1:+.3f}" for l in d if d[l][2]]
    s += " | err_steps " + " ".join(errs)
    if '1f1b' in d and d['1f1b'][4]:
        b = d['1f1b'][4][0]
        s += " | median step x 1f1b " + " ".join(f"{l} {b/d[l][4][0]:.2f}" for l in d if l not in ('data2', '1f1b') and d[l][4])
        s += " | err_median " + " ".join(f"{l} {d[l][4][0]/d[l][4][1]-1:+.3f}" for l in d if d[l][4])
        s += " | step / busiest rank " + " ".join(f"{l} {d[l][1]/d[l][4][2]:.2f}" for l in d if d[l][4])
    print(s)
