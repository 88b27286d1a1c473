#!/usr/bin/python3
"""Draws the PNG figures of docs/ from the CSV files under docs/data/ (run by docs/figures.sh).

Usage: docs/plot_figures.py DATA_DIR OUT_DIR. A figure whose CSV is absent is skipped with a note.
Debian's python3 with matplotlib (TEST_PACKAGES)."""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def pipeline_bubble(data, out):
    r = rows(data)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    colors = {"afab": "tab:blue", "1f1b": "tab:orange", "zb-h1": "tab:green"}
    for ax, p in zip(axes, ["2", "4", "8"]):
        for s, c in colors.items():
            pts = sorted((int(x["m"]), float(x["virtual_bubble"]), float(x["wall_bubble"]),
                          float(x["analytic_bubble"])) for x in r if x["p"] == p and x["schedule"] == s)
            if not pts:
                continue
            m = [x[0] for x in pts]
            ax.plot(m, [x[1] for x in pts], "o-", color=c, label=f"{s} replay (virtual clock, not a timing)")
            ax.plot(m, [x[2] for x in pts], "x:", color=c, alpha=0.6, label=f"{s} measured (wall)")
            ax.plot(m, [x[3] for x in pts], "--", color=c, alpha=0.5, label=f"{s} analytic")
        ax.set_xscale("log", base=2)
        ax.set_title(f"p = {p} stages")
        ax.set_xlabel("micro-batches m")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("bubble fraction (idle / step)")
    axes[0].legend(fontsize=7)
    fig.suptitle("pipeline bubble: F = B = W = 10 ms timed sleeps (docs/data/pipeline_bubble.csv)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def parallel_layouts(data, out):
    r = rows(data)
    parts = [("compute_s", "compute"), ("tp_comm_s", "tensor all-reduce"), ("bubble_s", "pipeline bubble"),
             ("dp_exposed_s", "exposed DP all-reduce"), ("other_s", "other")]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    names = [x["layout"] for x in r]
    left = [0.0] * len(r)
    for key, label in parts:
        v = [1e3 * float(x[key]) for x in r]
        ax.barh(names, v, left=left, label=label)
        left = [a + b for a, b in zip(left, v)]
    ax.set_xlabel("ms per step (median; components: mean over ranks)")
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("vit, global batch 256, 2 ranks (docs/data/parallel_layouts.csv)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def allreduce(data, out):
    r = rows(data)
    fig, ax = plt.subplots(figsize=(7, 4))
    for algo in sorted({x["algorithm"] for x in r}):
        pts = sorted((int(x["bytes"]), float(x["busbw_GBps"])) for x in r if x["algorithm"] == algo)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label=algo)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("bus bandwidth, GB/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("float32 sum all-reduce, 2 ranks on one node (docs/data/allreduce_np2.csv)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    data_dir, out_dir = sys.argv[1], sys.argv[2]
    for name, draw in [("pipeline_bubble", pipeline_bubble), ("parallel_layouts", parallel_layouts),
                       ("allreduce_np2", allreduce)]:
        src = os.path.join(data_dir, name + ".csv")
        if not os.path.exists(src):
            print(f"figures: {src} absent, {name}.png not drawn")
            continue
        dst = os.path.join(out_dir, name + ".png")
        draw(src, dst)
        print("figures: wrote", dst)


if __name__ == "__main__":
    main()
