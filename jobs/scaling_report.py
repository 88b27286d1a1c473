#!/usr/bin/python3
"""Fit the cost model (jobs/costmodel.py) to a scaling study and write its report.
   /usr/bin/python3 jobs/scaling_report.py runs/scaling
Reads sweeps/*.csv, runs.csv and train/*.jsonl written by jobs/scaling_study.sh; writes
model.json, validation.csv, scaling.csv, predictions.csv, scaling.png and report.txt."""
import argparse
import csv
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import costmodel as cm  # noqa: E402

CORES = os.cpu_count() or 1
TOL = 0.15
# The cluster the target statement is about (stated in the report).
TARGET = {"ranks": 1024, "ranks_per_node": 4, "shm": {"alpha": 1e-6, "beta": 1 / 20e9},
          "gbit": [25.0, 200.0], "gpu_step_ms": {"resnet": 15.0, "cnn": 3.0}}


def load_sweeps(d):
    out = {}
    for f in sorted(os.listdir(d)):
        m = re.fullmatch(r"(\w+)-(\d+)n(\d+)r\.csv", f)
        if not m:
            continue
        pts = []
        for r in csv.DictReader(open(os.path.join(d, f))):
            pts.append((r["algorithm"], float(r["bytes"]), int(r["ranks"]), float(r["time_us"]) * 1e-6))
        out[(m.group(1), int(m.group(2)), int(m.group(3)))] = pts
    return out


def load_run(path):
    start, epoch = None, None
    for line in open(path):
        j = json.loads(line)
        if j.get("event") == "start":
            start = j
        elif j.get("event") == "epoch":
            epoch = j
    if not start or not epoch:
        raise ValueError(f"{path}: no start/epoch record (did the run fail? see the .log beside it)")
    cfg = start["config"]
    num = lambda key, dflt: float(m.group(1)) if (m := re.search(rf"^{key} = ([0-9.e+-]+)", cfg, re.M)) else dflt
    steps = epoch["step"]
    return {"params": start["params"], "ranks": start["ranks"], "global_batch": start["global_batch"],
            "steps": steps, "step_s": epoch["time_s"] / steps, "compute_s": epoch["compute_s"] / steps,
            "exposed_s": epoch["comm_exposed_s"] / steps, "data_s": epoch["data_wait_s"] / steps,
            "images_per_s": epoch["images_per_s"], "fusion": num("fusion_threshold", 64 << 20),
            "cycle_s": num("cycle_time_ms", 1.0) / 1e3}


def cluster_for(where, ranks, links, gamma):
    if where == "local":
        return cm.Cluster(1, ranks, links["shm"], links["shm"], gamma)
    cls = where.split("-", 1)[1]
    if cls == "slow":  # link-bound: the shaped link is the network (its own α and β, no CPU term)
        return cm.Cluster(ranks, 1, links["shm"], links["slow"], gamma)
    net = links.get(cls, links.get("net"))
    # A shaped link's wire: the tc rate the study set (tbf_rate.txt), else the fitted β.
    beta_link = 0.0
    if cls == "tbf":
        beta_link = cm.gbit_to_beta(net["wire_gbit"]) if "wire_gbit" in net else net["beta"]
    return cm.Cluster(ranks, 1, links["shm"], links.get("net", net), gamma, cores=CORES, beta_link=beta_link)


def tc_gbit(path):
    """A tc rate written by the study (e.g. 2gbit, 100mbit) in Gbit/s; None if absent."""
    try:
        txt = open(path).read().strip().lower()
    except OSError:
        return None
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", txt)
    if not m:
        sys.exit(f"scaling_report: {path}: '{txt}' is not a tc rate such as 2gbit or 100mbit")
    return float(m.group(1)) * {"k": 1e-6, "m": 1e-3, "g": 1.0, "": 1e-9}[m.group(2)]


def fit(sweeps, out):
    links, gamma = {}, 0.0
    if ("shm", 1, 2) not in sweeps:
        sys.exit("scaling_report: sweeps/shm-1n2r.csv missing: the shared-memory fit needs it")
    _, gamma = cm.fit_sweep(sweeps[("shm", 1, 2)])
    links["shm"] = cm.fit_link(sweeps[("shm", 1, 2)], gamma)
    for cls in ("net", "tbf", "slow"):
        if (cls, 2, 2) in sweeps:
            links[cls] = cm.fit_link(sweeps[(cls, 2, 2)], gamma)
    rate = tc_gbit(os.path.join(out, "tbf_rate.txt"))
    if rate and "tbf" in links:
        links["tbf"]["wire_gbit"] = rate
    return links, gamma


def validate_sweeps(sweeps, links, gamma):
    rows = []
    for (cls, m, p), pts in sorted(sweeps.items()):
        fitted = (m == 2 and p == 2) or (cls == "shm" and p == 2)
        if cls == "shm":
            c = cm.Cluster(1, p, links["shm"], links["shm"], gamma)
        elif cls in links:
            c = cluster_for(f"hosts-{cls}", p, links, gamma)
        else:
            continue
        for algo, n, _, t in pts:
            pred = cm.t_allreduce(n, c, algo)
            rows.append({"sweep": f"{cls}-{m}n{p}r", "fitted_on": int(fitted), "algorithm": algo, "bytes": int(n),
                         "measured_us": t * 1e6, "predicted_us": pred * 1e6, "error": pred / t - 1})
    return rows


def work_of(runs, model):
    one = [r for r in runs if r["where"] == "local" and r["mode"] == "weak" and r["model"] == model and r["ranks"] == 1]
    two = [r for r in runs if r["where"] == "local" and r["mode"] == "weak" and r["model"] == model and r["ranks"] == 2]
    if not one:
        return None
    r1 = one[0]["m"]
    w = {"grad_bytes": 4.0 * r1["params"], "t_compute": r1["compute_s"],
         "t_other": max(0.0, r1["step_s"] - r1["compute_s"] - r1["exposed_s"]), "cycle_s": r1["cycle_s"],
         "omega": 0.0, "batch": one[0]["batch"], "fusion": r1["fusion"]}
    return w, (two[0] if two else None)


def fit_omega(w, two, links, gamma):
    """Overlap window from the 2-rank run: predicted all-reduce time minus measured exposure."""
    if not two:
        return 0.0
    c = cm.Cluster(1, 2, links["shm"], links["shm"], gamma)
    trial = dict(w, omega=0.0)
    _, d = cm.step_time(trial, c, w["fusion"])
    hidden = d["allreduce_s"] - two["m"]["exposed_s"]
    return min(1.0, max(0.0, hidden / max(two["m"]["compute_s"], 1e-9)))


def predict_run(r, work, links, gamma, own_compute=False):
    """Step time of a run. own_compute: take compute per step from the run's own time split (the
    trainer's metrics), so only communication and overlap are predicted; otherwise compute per
    sample from the 1-rank run, times the batch, times the oversubscription of this machine's cores."""
    w = dict(work[r["model"]])
    slowdown = 1.0
    if own_compute:
        w["t_compute"] = r["m"]["compute_s"]
    else:
        w["t_compute"] *= r["batch"] / w["batch"]
        slowdown = max(1.0, r["ranks"] / CORES)  # all ranks of this study share this machine's cores
    c = cluster_for(r["where"], r["ranks"], links, gamma)
    return cm.step_time(w, c, w["fusion"], compute_slowdown=slowdown)


def user_cluster(a, work, links, gamma):
    """Predicted weak scaling of `cnn` (or the first model measured) on the user's cluster."""
    model = "cnn" if "cnn" in work else next(iter(work), None)
    if model is None:
        return None
    ranks = [a.ranks_per_node * 2 ** k for k in range(0, 20) if a.ranks_per_node * 2 ** k <= max(a.ranks, 2)]
    eff = lambda p: cm.efficiency(work[model], cm.cluster_of(p, a.ranks_per_node, a.gbit, a.latency_us,
                                                             links["shm"], gamma))[0]
    curve = [(p, eff(p)) for p in ranks]
    return {"desc": f"{model}, {a.ranks} ranks, {a.ranks_per_node} per node, {a.gbit:g} Gbit/s, {a.latency_us:g} us",
            "curve": curve, "knee": cm.knee(eff, ranks)}


def main():
    ap = argparse.ArgumentParser(description="fit the cost model to a scaling study and write its report")
    ap.add_argument("out", nargs="?", default="runs/scaling")
    ap.add_argument("--ranks", type=int, default=1024, help="your cluster: ranks (predicted up to here)")
    ap.add_argument("--ranks-per-node", type=int, default=4)
    ap.add_argument("--gbit", type=float, default=25.0, help="node link Gbit/s")
    ap.add_argument("--latency-us", type=float, default=15.0, help="one-way network latency")
    a = ap.parse_args()
    for key in ("ranks", "ranks_per_node", "gbit", "latency_us"):
        if getattr(a, key) <= 0:
            sys.exit(f"scaling_report: --{key.replace('_', '-')} must be > 0, got {getattr(a, key)}")
    out = a.out
    sweeps = load_sweeps(os.path.join(out, "sweeps"))
    links, gamma = fit(sweeps, out)
    runs = []
    for r in csv.DictReader(open(os.path.join(out, "runs.csv"))):
        try:
            m = load_run(r["metrics"])
        except (OSError, ValueError) as e:
            print(f"scaling_report: skipping {r['where']} {r['mode']} {r['model']} x{r['ranks']}: {e}")
            continue
        runs.append({"where": r["where"], "mode": r["mode"], "model": r["model"], "ranks": int(r["ranks"]),
                     "nodes": int(r["nodes"]), "batch": int(r["batch_per_rank"]), "m": m})
    work, fitted_runs = {}, set()
    for model in sorted({r["model"] for r in runs}):
        got = work_of(runs, model)
        if not got:
            continue
        w, two = got
        w["omega"] = fit_omega(w, two, links, gamma)
        work[model] = w
        fitted_runs.add(("local", "weak", model, 1))
        if two:
            fitted_runs.add(("local", "weak", model, 2))
    json.dump({"links": links, "gamma": gamma, "work": work, "cores": CORES}, open(os.path.join(out, "model.json"), "w"),
              indent=1)

    vrows = validate_sweeps(sweeps, links, gamma)
    write_csv(os.path.join(out, "validation.csv"), vrows)
    srows = []
    for r in runs:
        if r["model"] not in work:
            continue
        t0, _ = predict_run(r, work, links, gamma)
        t, d = predict_run(r, work, links, gamma, own_compute=True)
        m = r["m"]
        srows.append({"where": r["where"], "mode": r["mode"], "model": r["model"], "ranks": r["ranks"],
                      "nodes": r["nodes"], "batch_per_rank": r["batch"], "global_batch": m["global_batch"],
                      "images_per_s": m["images_per_s"], "step_ms": m["step_s"] * 1e3,
                      "compute_ms": m["compute_s"] * 1e3, "predicted_step_ms": t * 1e3, "error": t / m["step_s"] - 1,
                      "predicted_step_model_compute_ms": t0 * 1e3, "error_model_compute": t0 / m["step_s"] - 1,
                      "exposed_ms": m["exposed_s"] * 1e3, "predicted_exposed_ms": d["exposed_s"] * 1e3,
                      "data_wait_ms": m["data_s"] * 1e3, "allreduce_model_ms": d["allreduce_s"] * 1e3,
                      "fitted_on": int((r["where"], r["mode"], r["model"], r["ranks"]) in fitted_runs)})
    write_csv(os.path.join(out, "scaling.csv"), srows)
    preds = target_predictions(work, gamma)
    write_csv(os.path.join(out, "predictions.csv"), preds)
    import scaling_plot
    scaling_plot.plot(os.path.join(out, "scaling.png"), srows, sweeps, links, gamma, work, TARGET)
    text = report_text(out, links, gamma, work, vrows, srows, preds, user_cluster(a, work, links, gamma))
    open(os.path.join(out, "report.txt"), "w").write(text)
    print(text)


def target_predictions(work, gamma):
    rows = []
    for model, w in sorted(work.items()):
        for compute in ("measured", "gpu"):
            ww = dict(w)
            if compute == "gpu":
                ww["t_compute"] = TARGET["gpu_step_ms"].get(model, 10.0) / 1e3
                ww["t_other"] = 0.0
            for g in TARGET["gbit"]:
                alpha = cm.default_alpha_us(g) * 1e-6
                for p in (8, 64, 256, 1024):
                    q = min(TARGET["ranks_per_node"], p)
                    c = cm.Cluster(p // q, q, TARGET["shm"], {"alpha": alpha, "beta": cm.gbit_to_beta(g)}, gamma)
                    # "all": ring, tree, hierarchical (all in src/comm); "flat": without hierarchical.
                    for algos, name in ((cm.ALGORITHMS, "all"), (("ring", "tree"), "flat")):
                        eff, tp, f, d = cm.efficiency(ww, c, algos)
                        rows.append({"model": model, "compute": compute, "gbit": g, "alpha_us": alpha * 1e6,
                                     "ranks": p, "nodes": c.m, "algorithms": name, "step_ms": tp * 1e3,
                                     "allreduce_ms": d["allreduce_s"] * 1e3, "exposed_ms": d["exposed_s"] * 1e3,
                                     "efficiency": eff, "algorithm": d["algorithm"], "fusion_bytes": f})
    return rows


def write_csv(path, rows):
    if not rows:
        open(path, "w").close()
        return
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        wr.writeheader()
        wr.writerows(rows)


from scaling_text import report_text  # noqa: E402

if __name__ == "__main__":
    main()
