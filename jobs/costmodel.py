#!/usr/bin/python3
"""ringtrain's cost model: all-reduce and training-step time from α-β-γ link parameters.

Collectives (n bytes, p ranks on m nodes of q ranks, link classes `shm` inside a node and `net`
between nodes, each with a latency α [s] and an inverse bandwidth β [s/byte]; γ [s/byte] is the
reduction cost of the CPU reducer):
  ring       2(p-1)·(α + n/p·β) + (p-1)/p·n·γ                  every hop of a step runs at once,
             the slowest link class sets the step (ranks of a node are consecutive, so one ring
             link per node crosses the network and a node's NIC carries one flow)
  tree       recursive doubling (src/comm/tree.cpp): lg p' exchanges of the whole vector
             (+2 fold steps when p is not a power of two); exchanges with partners inside the
             node use shm; across nodes the q ranks of a node share the NIC: α + q·n·β
  hier       reduce-scatter inside the node (shm ring, q ranks), q concurrent rings over the
             m nodes on n/q bytes each (sharing the NIC), all-gather inside the node
Training step (data-parallel, gradients in fusion buckets of F bytes, backward overlap):
  T = t_other + t_compute·s + exposed,  exposed = max(T_ar(last bucket), Σ T_ar(buckets) − W)
  W = ω·t_compute: the part of the step during which gradients can already be reduced,
  fitted from a run's measured exposed communication. s > 1 only where ranks share cores.
Testbed term (emulated hosts share this machine's cores and kernel): a veth flow costs
  β_eff = max(β_link, β_veth·max(1, flows/cores)); tc-shaped links set β_link.
Fitted links may carry per-algorithm (α, β) ("per_algo"): on TCP the ring's many small steps and
the tree's whole-vector exchanges do not reach the same effective bandwidth (e.g. 2x apart on
tbf-shaped veth here), so each algorithm is predicted with the parameters fitted on its own 2-rank
points; links given by hand (a target cluster) have one (α, β).
Failures, restarts and checkpoints (issue 46; time in any one unit, e.g. seconds or steps):
  a run checkpoints every τ of useful work at a cost δ each; failures arrive with exponential
  inter-arrival of mean M during work (not during a restart), each costs a restart R and the work
  since the newest complete checkpoint. Young: τ* = sqrt(2δM) (first order: waste δ/τ + τ/(2M) +
  R/M); Daly: τ* = sqrt(2δM)·(1 + sqrt(δ/2M)/3 + δ/18M) − δ and the exact expected wall time
  (M + R)(e^{(τ+δ)/M} − 1) per τ of work. run_with_failures() is the step-level form the injected-
  failure benchmark measures: N steps of t seconds, a snapshot or checkpoint every k steps, complete
  by the end of the next step, so a failure after step r loses r − (the newest complete one): k at
  a snapshot's own step, else the steps since it, (k + 1)/2 on average.
"""
import argparse
import json
import math
import sys

ALGORITHMS = ("ring", "tree", "hier")


def log2_floor(p):
    return int(math.floor(math.log2(p))) if p >= 1 else 0


class Cluster:
    """Link parameters of a machine layout: m nodes x q ranks."""

    def __init__(self, nodes, ranks_per_node, shm, net, gamma, cores=None, beta_link=0.0):
        self.m, self.q = int(nodes), int(ranks_per_node)
        self.shm, self.net = dict(shm), dict(net)  # {"alpha": s, "beta": s/B}
        self.gamma = float(gamma)
        self.cores = cores          # emulated testbed: physical cores all hosts share (None: dedicated)
        self.beta_link = beta_link  # testbed: shaped link (tc tbf) inverse bandwidth

    @property
    def p(self):
        return self.m * self.q

    @property
    def share(self):
        """Testbed: ranks per core when the emulated hosts outnumber the cores. Every rank's software
        work (a message's latency, the reduction) then gets 1/share of a core."""
        return max(1.0, self.p / self.cores) if self.cores else 1.0

    def net_beta(self, flows, b=None):
        b = self.net["beta"] if b is None else b
        if self.cores:  # veth flows share the CPU that moves their bytes
            b = max(self.beta_link, b * max(1.0, flows / self.cores))
        return b


def ab(link, algo):
    """(α, β) of a link class for one algorithm: its own fit where there is one."""
    x = link.get("per_algo", {}).get(algo, link)
    return x["alpha"], x["beta"]


def t_ring(n, c):
    p = c.p
    if p == 1:
        return 0.0
    if c.m == 1:
        a, b = ab(c.shm, "ring")
    else:
        (a_s, b_s), (a_n, b_n) = ab(c.shm, "ring"), ab(c.net, "ring")
        a, b = max(a_n, a_s), max(c.net_beta(c.m, b_n), b_s)
    return 2 * (p - 1) * (a * c.share + n / p * b) + (p - 1) / p * n * c.gamma * c.share


def t_tree(n, c):
    p = c.p
    if p == 1:
        return 0.0
    pof2 = 1 << log2_floor(p)
    (a_s, b_s), (a_n, b_n) = ab(c.shm, "tree"), ab(c.net, "tree")
    t = 0.0
    mask = 1
    while mask < pof2:
        if mask < c.q:  # partner on the same node
            t += a_s * c.share + n * b_s
        else:           # q ranks of each node exchange across the NIC at once
            t += a_n * c.share + c.q * n * c.net_beta(p, b_n)
        t += n * c.gamma * c.share
        mask <<= 1
    if pof2 != p:  # fold in and send back out (one link class: the worst)
        a = a_n if c.m > 1 else a_s
        b = c.net_beta(p, b_n) if c.m > 1 else b_s
        t += 2 * (a * c.share + n * b) + n * c.gamma * c.share
    return t


def t_hier(n, c):
    if c.q == 1 or c.m == 1:
        return t_ring(n, c)
    q, m = c.q, c.m
    (a_s, b_s), (a_n, b_n) = ab(c.shm, "ring"), ab(c.net, "ring")
    intra = (q - 1) * (a_s + n / q * b_s)                    # one pass (reduce-scatter or all-gather)
    rs = intra + (q - 1) / q * n * c.gamma
    chunk = n / q
    inter = 2 * (m - 1) * (a_n + chunk / m * q * c.net_beta(m * q, b_n)) + (m - 1) / m * chunk * c.gamma
    return rs + inter + intra


def t_allreduce(n, c, algo):
    return {"ring": t_ring, "tree": t_tree, "hier": t_hier}[algo](n, c)


def best_allreduce(n, c, algos=ALGORITHMS):
    return min((t_allreduce(n, c, a), a) for a in algos)


def buckets(n, fusion):
    if fusion <= 0 or fusion >= n:
        return [n]
    k = int(math.ceil(n / fusion))
    return [fusion] * (k - 1) + [n - fusion * (k - 1)]


def step_time(work, c, fusion, algos=ALGORITHMS, compute_slowdown=1.0):
    """work: {"grad_bytes", "t_compute", "t_other", "omega", "cycle_s"} -> (T, detail)."""
    parts = buckets(work["grad_bytes"], fusion)
    times, chosen = [], set()
    for b in parts:
        t, a = best_allreduce(b, c, algos)
        times.append(t + work.get("cycle_s", 0.0) / 2 if c.p > 1 else 0.0)
        chosen.add(a)
    tc = work["t_compute"] * compute_slowdown
    window = work["omega"] * tc
    exposed = max(times[-1], sum(times) - window) if c.p > 1 else 0.0
    total = work["t_other"] + tc + exposed
    return total, {"allreduce_s": sum(times), "exposed_s": exposed, "compute_s": tc,
                   "algorithm": "+".join(sorted(chosen)), "buckets": len(parts)}


FUSION_CHOICES = [2 ** k for k in range(16, 28, 2)]  # 64 KiB .. 64 MiB


def best_config(work, c, algos=ALGORITHMS, compute_slowdown=1.0):
    best = None
    for f in FUSION_CHOICES:
        t, d = step_time(work, c, f, algos, compute_slowdown)
        if best is None or t < best[0] - 1e-12:
            best = (t, f, d)
    return best


def efficiency(work, c, algos=ALGORITHMS):
    """Weak scaling: per-rank batch fixed, so efficiency = T(1 rank) / T(p ranks)."""
    one = Cluster(1, 1, c.shm, c.net, c.gamma)
    t1, _ = step_time(work, one, 0, algos)
    tp, f, d = best_config(work, c, algos)
    return t1 / tp, tp, f, d


def knee(eff_of, ranks, threshold=0.8):
    """The first rank count (of `ranks`, ascending) whose efficiency eff_of(p) is below threshold;
    None if none is. eff_of: p -> efficiency (e.g. lambda p: efficiency(work, cluster(p))[0])."""
    for p in sorted(ranks):
        if eff_of(p) < threshold:
            return p
    return None


def cluster_of(ranks, ranks_per_node, gbit, latency_us, shm, gamma):
    """A user's cluster: `ranks` ranks, `ranks_per_node` per node, node links of gbit Gbit/s and
    latency_us one-way latency; shm (intra-node α, β) and gamma as fitted here."""
    q = min(ranks_per_node, ranks)
    return Cluster(max(1, ranks // q), q, shm, {"alpha": latency_us * 1e-6, "beta": gbit_to_beta(gbit)}, gamma)


def nnls(rows, ys, weights):
    """Least squares with non-negative coefficients (few unknowns: drop negatives and refit)."""
    import numpy as np
    A = np.asarray(rows, float) * np.asarray(weights, float)[:, None]
    y = np.asarray(ys, float) * np.asarray(weights, float)
    active = list(range(A.shape[1]))
    x = np.zeros(A.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(A[:, active], y, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def design_row(algo, n, p, q=None):
    """Coefficients of (α, β, γ) for one link class, all ranks on that class (sweep fits)."""
    if algo == "ring":
        return [2 * (p - 1), 2 * (p - 1) / p * n, (p - 1) / p * n]
    pof2 = 1 << log2_floor(p)
    s = log2_floor(pof2)
    extra = 2 if pof2 != p else 0
    return [s + extra, (s + extra) * n, (s + (1 if extra else 0)) * n]


def fit_sweep(points, gamma=None):
    """points: [(algo, bytes, ranks, seconds)] of one link class -> {"alpha","beta"}, gamma.
    Relative-error weighting so that small (latency) and large (bandwidth) messages both count."""
    rows, ys, ws = [], [], []
    for algo, n, p, t in points:
        r = design_row(algo, n, p)
        if gamma is not None:
            t = t - r[2] * gamma
            r = r[:2]
        rows.append(r)
        ys.append(t)
        ws.append(1.0 / max(t, 1e-9) if t > 0 else 1.0)
    x = nnls(rows, ys, ws)
    g = gamma if gamma is not None else float(x[2])
    return {"alpha": float(x[0]), "beta": float(x[1])}, g


def fit_link(points, gamma):
    """Joint (α, β) of a link class plus each algorithm's own (see the module docstring)."""
    link, _ = fit_sweep(points, gamma)
    per = {}
    for algo in sorted({a for a, *_ in points}):
        own = [x for x in points if x[0] == algo]
        if len({n for _, n, _, _ in own}) >= 2:
            per[algo], _ = fit_sweep(own, gamma)
    if per:
        link["per_algo"] = per
    return link


# ---- Failures, restarts and checkpoints (issue 46) ----

def young_interval(save, mttf):
    """Young's checkpoint interval (same unit as save and mttf): minimises waste_first_order."""
    return math.sqrt(2.0 * save * mttf)


def daly_interval(save, mttf):
    """Daly's higher-order optimum for exponential failures (save < 2 mttf), else mttf."""
    if save >= 2.0 * mttf:
        return mttf
    r = save / (2.0 * mttf)
    return math.sqrt(2.0 * save * mttf) * (1.0 + math.sqrt(r) / 3.0 + r / 9.0) - save


def waste_first_order(interval, save, mttf, restart=0.0):
    """Fraction of the time not spent on useful work, first order in 1/mttf: the saves, half an
    interval of lost work and a restart per failure."""
    return save / interval + (interval / 2.0 + restart) / mttf


def daly_wall(work, interval, save, mttf, restart=0.0):
    """Exact expected wall time of `work` useful time: every segment of `interval` work plus its
    save is retried until no failure hits it; a failure costs the restart and the segment so far."""
    return (mttf + restart) * math.expm1((interval + save) / mttf) * work / interval


def lost_steps(every):
    """Mean steps lost per failure with a snapshot every `every` steps, complete by the end of the
    next step, a failure coming after a uniformly placed step: (every + 1) / 2."""
    return (every + 1) / 2.0


def run_with_failures(steps, step_s, mttf_steps, restart_s, every, save_s=0.0, failures=None):
    """A run of `steps` useful steps of step_s seconds, failures per executed step with mean
    mttf_steps, a checkpoint every `every` steps costing save_s (or a per-step overhead: every=1),
    each failure restart_s and lost_steps(every) steps trained again. `failures`: the count that
    came (otherwise the expected count, steps / (mttf_steps − lost)). Returns a dict: failures,
    executed steps, wall_s, useful_s and ratio = useful / wall (the effective training time)."""
    lost = lost_steps(every)
    if failures is None:
        failures = steps / (mttf_steps - lost) if mttf_steps > lost else float("inf")
    executed = steps + failures * lost
    wall = executed * step_s + executed / every * save_s + failures * restart_s
    useful = steps * step_s
    return {"failures": failures, "executed": executed, "wall_s": wall, "useful_s": useful,
            "ratio": useful / wall if wall > 0 else 0.0, "lost_per_failure": lost}


def gbit_to_beta(gbit):
    return 8.0 / (gbit * 1e9)


def main():
    ap = argparse.ArgumentParser(description="predict step time and weak-scaling efficiency from a fitted model "
                                             "(runs/scaling/model.json from jobs/scaling_study.sh)")
    ap.add_argument("--model", default="runs/scaling/model.json")
    ap.add_argument("--net", default="resnet", help="network whose measured work to use (cnn, resnet)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024])
    ap.add_argument("--ranks-per-node", type=int, default=4)
    ap.add_argument("--gbit", type=float, nargs="+", default=[25.0, 200.0], help="node link Gbit/s")
    ap.add_argument("--alpha-us", type=float, default=None, help="network latency (default: per --gbit, see README)")
    ap.add_argument("--shm-gbyte", type=float, default=None, help="intra-node GB/s (default: fitted)")
    ap.add_argument("--shm-alpha-us", type=float, default=None, help="intra-node latency (default: fitted)")
    ap.add_argument("--step-compute-ms", type=float, default=None,
                    help="compute per step per rank (default: measured here); e.g. a GPU's")
    a = ap.parse_args()
    try:
        model = json.load(open(a.model))
    except OSError as e:
        sys.exit(f"costmodel: cannot read model '{a.model}': {e.strerror} (run jobs/scaling_study.sh first)")
    if a.net not in model["work"]:
        sys.exit(f"costmodel: no measured work for network '{a.net}' in {a.model} (have: {', '.join(model['work'])})")
    for r in a.ranks:
        if r < 1 or r % a.ranks_per_node and r > a.ranks_per_node:
            sys.exit(f"costmodel: --ranks {r} is not a multiple of --ranks-per-node {a.ranks_per_node}")
    work = dict(model["work"][a.net])
    if a.step_compute_ms is not None:
        work["t_compute"] = a.step_compute_ms / 1e3
    shm = dict(model["links"]["shm"])
    if a.shm_gbyte:
        shm["beta"] = 1 / (a.shm_gbyte * 1e9)
    if a.shm_alpha_us is not None:
        shm["alpha"] = a.shm_alpha_us * 1e-6
    print(f"{'ranks':>6} {'nodes':>6} {'Gbit/s':>7} {'step ms':>9} {'allreduce ms':>13} {'exposed ms':>11} "
          f"{'efficiency':>10}  algorithm, fusion")
    for g in a.gbit:
        alpha = (a.alpha_us if a.alpha_us is not None else default_alpha_us(g)) * 1e-6
        for r in a.ranks:
            q = min(a.ranks_per_node, r)
            c = Cluster(r // q, q, shm, {"alpha": alpha, "beta": gbit_to_beta(g)}, model["gamma"])
            eff, tp, f, d = efficiency(work, c)
            print(f"{r:>6} {c.m:>6} {g:>7g} {tp * 1e3:>9.2f} {d['allreduce_s'] * 1e3:>13.3f} "
                  f"{d['exposed_s'] * 1e3:>11.3f} {eff * 100:>9.1f}%  {d['algorithm']}, {f / 2**20:g} MiB")


def default_alpha_us(gbit):
    """Typical one-way small-message latency: Ethernet/TCP at <=100 Gbit/s, RDMA fabrics above."""
    return 15.0 if gbit <= 100 else 2.0


if __name__ == "__main__":
    main()
