"""The figure of jobs/scaling_report.py: measured vs predicted scaling, the sweep fits, predictions."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import costmodel as cm  # noqa: E402


def plot(path, srows, sweeps, links, gamma, work, target):
    fig, ax = plt.subplots(2, 2, figsize=(12, 9))
    a = ax[0][0]
    for (where, mode) in sorted({(r["where"], r["mode"]) for r in srows if r["model"] == "cnn"}):
        rs = sorted((r for r in srows if r["where"] == where and r["mode"] == mode and r["model"] == "cnn"),
                    key=lambda r: r["ranks"])
        x = [r["ranks"] for r in rs]
        line, = a.plot(x, [r["images_per_s"] for r in rs], "o-", label=f"{where} {mode} (measured)")
        pred = [r["global_batch"] / (r["predicted_step_ms"] / 1e3) for r in rs]
        a.plot(x, pred, "x--", color=line.get_color(), label=f"{where} {mode} (model)")
    a.set_xlabel("ranks"); a.set_ylabel("images/s"); a.set_title("cnn throughput: measured and predicted")
    a.legend(fontsize=7)

    a = ax[0][1]
    for (where, mode) in sorted({(r["where"], r["mode"]) for r in srows if r["model"] == "cnn"}):
        rs = sorted((r for r in srows if r["where"] == where and r["mode"] == mode and r["model"] == "cnn"),
                    key=lambda r: r["ranks"])
        base = next((r for r in srows if r["where"] == "local" and r["mode"] == mode and r["model"] == "cnn"
                     and r["ranks"] == 1), None)
        if base:
            a.plot([r["ranks"] for r in rs], [r["images_per_s"] / (base["images_per_s"] * r["ranks"]) for r in rs],
                   "o-", label=f"{where} {mode}")
    a.set_ylim(0, 1.15); a.set_xlabel("ranks"); a.set_ylabel("efficiency vs 1 rank")
    a.set_title("measured parallel efficiency (2 cores: >2 ranks oversubscribe)"); a.legend(fontsize=7)

    a = ax[1][0]
    for (cls, m, p), pts in sorted(sweeps.items()):
        if p != 2 and not (cls != "shm" and p == 4):
            continue
        for algo, mk in (("ring", "o"), ("tree", "s")):
            xs = [n for al, n, _, _ in pts if al == algo]
            if not xs:
                continue
            line, = a.loglog(xs, [t * 1e6 for al, n, _, t in pts if al == algo], mk, ms=4,
                             label=f"{cls}-{m}n{p}r {algo}")
            if cls == "shm":
                c = cm.Cluster(1, p, links["shm"], links["shm"], gamma)
            elif cls in links:
                c = cm.Cluster(p, 1, links["shm"], links.get("net", links[cls]), gamma, cores=2,
                               beta_link=links[cls]["beta"] if cls == "tbf" else 0.0)
            else:
                continue
            a.loglog(xs, [cm.t_allreduce(n, c, algo) * 1e6 for n in xs], "-", color=line.get_color(), lw=0.8)
    a.set_xlabel("bytes"); a.set_ylabel("all-reduce time (us)"); a.set_title("sweeps (points) and model (lines)")
    a.legend(fontsize=6, ncol=2)

    a = ax[1][1]
    ranks = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    for model, w in sorted(work.items()):
        for compute in ("measured", "gpu"):
            ww = dict(w)
            if compute == "gpu":
                ww["t_compute"], ww["t_other"] = target["gpu_step_ms"].get(model, 10.0) / 1e3, 0.0
            for g in target["gbit"]:
                eff = []
                for p in ranks:
                    q = min(target["ranks_per_node"], p)
                    c = cm.Cluster(p // q, q, target["shm"],
                                   {"alpha": cm.default_alpha_us(g) * 1e-6, "beta": cm.gbit_to_beta(g)}, gamma)
                    eff.append(cm.efficiency(ww, c)[0])
                a.semilogx(ranks, eff, "-", label=f"{model} {compute} compute, {g:g} Gbit/s", base=2)
    a.set_ylim(0, 1.05); a.set_xlabel("ranks (4 per node)"); a.set_ylabel("predicted weak-scaling efficiency")
    a.set_title("model: weak scaling to 1,024 ranks"); a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
