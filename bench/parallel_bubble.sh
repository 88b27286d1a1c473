#!/usr/bin/env bash
# Pipeline bubble sweep: p in {2, 4, 8}, m in {1..32}, every schedule; writes
# runs/bench/pipeline_bubble.csv and pipeline_bubble.png (stage compute is a
# timed sleep, see bench/parallel_bubble.cpp). Usage: bench/parallel_bubble.sh [build-dir] [unit-ms]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
UNIT=${2:-10}
OUT=runs/bench
mkdir -p "$OUT"
rm -f "$OUT/pipeline_bubble.csv"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for p in 2 4 8; do
  mpirun --oversubscribe --bind-to none -np "$p" "$B/bench/bench_parallel_bubble" --unit-ms "$UNIT" \
    --csv "$OUT/pipeline_bubble.csv"
done
/usr/bin/python3 - "$OUT/pipeline_bubble.csv" "$OUT/pipeline_bubble.png" <<'PY'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
colors = {"afab": "tab:blue", "1f1b": "tab:orange", "zb-h1": "tab:green"}
for ax, p in zip(axes, ["2", "4", "8"]):
    for s, c in colors.items():
        r = sorted((int(x["m"]), float(x["virtual_bubble"]), float(x["wall_bubble"]), float(x["analytic_bubble"]))
                   for x in rows if x["p"] == p and x["schedule"] == s)
        if not r:
            continue
        m = [x[0] for x in r]
        ax.plot(m, [x[1] for x in r], "o-", color=c, label=f"{s} replay (virtual clock, not a timing)")
        ax.plot(m, [x[2] for x in r], "x:", color=c, alpha=0.6, label=f"{s} measured (wall)")
        ax.plot(m, [x[3] for x in r], "--", color=c, alpha=0.5, label=f"{s} analytic")
    ax.set_xscale("log", base=2)
    ax.set_title(f"p = {p} stages")
    ax.set_xlabel("micro-batches m")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("bubble fraction (idle / step)")
axes[0].legend(fontsize=7)
fig.suptitle("ringtrain pipeline bubble (F = B = W timed sleeps; 1F1B/AFAB analytic (p-1)/(m+p-1), ZB-H1 Qi et al.)")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print("wrote", sys.argv[2])
PY
