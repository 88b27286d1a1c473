#!/usr/bin/python3
"""Plot a scaling study's CSV (from jobs/scaling_study.sh): throughput and efficiency."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src, dst = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(src)))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
for mode in ("strong", "weak"):
    pts = sorted((int(r["ranks"]), float(r["images_per_s"])) for r in rows if r["mode"] == mode)
    if not pts:
        continue
    ranks = [p[0] for p in pts]
    ips = [p[1] for p in pts]
    base = ips[0] / ranks[0]
    ax1.plot(ranks, ips, "o-", label=f"{mode} scaling")
    ax2.plot(ranks, [v / (base * r) for r, v in zip(ranks, ips)], "o-", label=f"{mode} scaling")
ax1.set_xlabel("ranks"); ax1.set_ylabel("images/s"); ax1.set_title("throughput"); ax1.legend()
ax2.set_xlabel("ranks"); ax2.set_ylabel("efficiency vs ideal"); ax2.set_ylim(0, 1.1)
ax2.set_title("parallel efficiency"); ax2.legend()
fig.tight_layout()
fig.savefig(dst, dpi=120)
print(f"wrote {dst}")
