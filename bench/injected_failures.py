#!/usr/bin/python3
"""Injected failures on the emulated Slurm cluster (bench/train_injected_failures.sh), two parts:

  injected_failures.py monitor --out JOB.out --json RUN.json [--mttf M --seed S | --at 60,120] ...
      follows a job of jobs/sbatch_elastic.sh through its output file, timestamps every step line,
      and kills one node's ranks (kill -9 of the `ringtrain` processes in that node's network
      namespace; its slurmd stays, so the node is alive for the relaunch) after a number of
      executed steps drawn from an exponential distribution of mean M (seeded), or at fixed counts
      (--at). The node's in-memory snapshots (checkpoint.memory_dir/node-e<i>) go with it. Writes
      the timeline to RUN.json when the job's output says it finished or stopped.
  injected_failures.py report DIR
      reads DIR/*.json (calibration runs cal_none, cal_mem, cal_disk; measured runs mem_M*, disk_M*)
      and prints the measured effective training time ratio (useful step time / wall time) beside
      the cost model's prediction (jobs/costmodel.py: run_with_failures), with the goals.

Times are this process's clock when a line appeared in the output file (polled every 5 ms).
"""
import argparse
import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "jobs"))
import costmodel as cm  # noqa: E402

STEP = re.compile(r"^epoch (\d+)/\d+ step (\d+)/(\d+) ")
LAUNCH = re.compile(r"^\[sbatch_elastic [0-9:]+\] launch (\d+): ")
FAILED = re.compile(r"^\[sbatch_elastic [0-9:]+\] step failed")
END = re.compile(r"^\[sbatch_elastic [0-9:]+\] (training finished|stopping:|training rejected)")


def ranks_in(ns):
    """The ringtrain processes in network namespace `ns`."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    pids = []
    for p in out:
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() == "ringtrain":
                    pids.append(int(p))
        except OSError:
            pass
    return pids


def monitor(a):
    rng = random.Random(a.seed)
    fixed = [int(x) for x in a.at.split(",")] if a.at else []
    nodes = a.nodes.split(",")

    def next_gap():
        if a.at:
            return fixed.pop(0) if fixed else None
        return max(1, round(rng.expovariate(1.0 / a.mttf))) if a.mttf > 0 else None

    gap, since, launch, armed = next_gap(), 0, -1, False
    steps, kills, launches, failed, buf, pos = [], [], [], [], "", 0
    last_step, end, t_end = 0, None, time.time() + a.timeout
    while end is None and time.time() < t_end:
        try:
            with open(a.out, "rb") as f:
                f.seek(pos)
                chunk = f.read()
                pos += len(chunk)
        except OSError:
            chunk = b""
        buf += chunk.decode(errors="replace")
        *lines, buf = buf.split("\n")
        now = time.time()
        for ln in lines:
            m = STEP.match(ln)
            if m:
                e, s, per = (int(x) for x in m.groups())
                last_step = (e - 1) * per + s
                steps.append([now, launch, last_step])
                if armed:
                    since += 1
                continue
            m = LAUNCH.match(ln)
            if m:
                launch = int(m.group(1))
                launches.append([now, launch])
                armed = True  # counts this launch's steps (after a kill: only the relaunch's)
                continue
            if FAILED.match(ln):
                failed.append(now)
                continue
            m = END.match(ln)
            if m:
                end = m.group(1)
        if end is None and armed and gap is not None and since >= gap:
            i = rng.randrange(len(nodes)) if not a.at else len(kills) % len(nodes)
            pids = ranks_in(nodes[i])
            if pids:
                for p in pids:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                tk = time.time()
                if a.memdir:
                    subprocess.run(["rm", "-rf", os.path.join(a.memdir, f"node-e{i}")])
                kills.append({"t": tk, "node": i + 1, "after_step": last_step, "executed_since": since,
                              "launch": launch, "pids": pids})
                armed, since, gap = False, 0, next_gap()
        time.sleep(0.005)
    run = {"name": a.name, "mttf": a.mttf, "seed": a.seed, "at": a.at, "steps": steps, "kills": kills,
           "launches": launches, "failed": failed, "end": end or "monitor timed out", "config": json.loads(a.config or "{}")}
    with open(a.json, "w") as f:
        json.dump(run, f)
    print(f"{a.name}: {len(kills)} failure(s) injected, {len(steps)} step lines, end: {run['end']}", flush=True)
    return 0 if end == "training finished" else 1


def analyse(run):
    """Wall time, executed steps, per-failure restart and lost steps of one run."""
    st = run["steps"]
    n_final = max(s for _, _, s in st)
    first = next(t for t, _, s in st if s == 1)
    last = max(t for t, _, s in st if s == n_final)
    # Step intervals inside a launch (not across a relaunch), by step: a save at step s is in the
    # interval of s (the copy) and of s + 1 (the wait for the snapshot, or the disk commit).
    iv = [(st[i][2], st[i][0] - st[i - 1][0]) for i in range(1, len(st))
          if st[i][1] == st[i - 1][1] and st[i][2] == st[i - 1][2] + 1]
    every = run["config"].get("every", 1) if run["config"].get("source") in ("mem", "disk") else 0
    mean = lambda v: sum(v) / len(v) if v else float("nan")  # noqa: E731
    quiet = [d for s, d in iv if every == 0 or s % every not in (0, 1)]
    t_quiet = mean(quiet)  # the step without a save's cost: this run's own step time
    # A save's cost: the medians of its two steps over the median of the others (medians: this 2-core
    # machine's other work adds spikes of a step or more, which a mean of tens of samples keeps).
    cost = (sum(median([d for s, d in iv if s % every == ph]) for ph in (0, 1)) - 2 * median(quiet)
            if every >= 3 else float("nan"))
    fails = []
    for k in run["kills"]:
        nxt = [(t, s) for t, l, s in st if l > k["launch"]]
        if not nxt:
            continue
        t1, s1 = nxt[0]
        # The relaunch's parts: the step's end seen by the script, the launch line, the first step line.
        seen = min((t for t in run.get("failed", []) if t > k["t"]), default=float("nan"))
        launch = min((t for t, l in run["launches"] if l > k["launch"]), default=float("nan"))
        fails.append({"gap_s": t1 - k["t"], "lost": k["after_step"] - (s1 - 1), "node": k["node"],
                      "to_failed_s": seen - k["t"], "to_launch_s": launch - k["t"], "launch_to_step_s": t1 - launch})
    return {"final_step": n_final, "wall_s": last - first, "executed": len(st) - 1, "intervals": len(iv),
            "mean_interval_s": mean([d for _, d in iv]), "t_s": t_quiet, "save_s": cost, "all": [d for _, d in iv], "failures": fails}


def median(v):
    v = sorted(v)
    n = len(v)
    return (v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])) if v else float("nan")


def calibrate(d):
    """The model's inputs from the calibration runs in directory d: step time t, the cost of one
    memory snapshot and one disk save (the mean step interval's excess over t, times the interval),
    the restart time from each (kill to the relaunch's first step line, less one step)."""
    runs = {}
    for n in ("cal_none", "cal_mem", "cal_disk"):
        p = os.path.join(d, n + ".json")
        if not os.path.exists(p):
            sys.exit(f"injected_failures.py: missing calibration run {p}")
        runs[n] = json.load(open(p))
    an = {n: analyse(r) for n, r in runs.items()}
    t = an["cal_none"]["t_s"]
    c = {"t": t, "an": an, "steps": an["cal_none"]["executed"]}
    for src in ("mem", "disk"):
        r, x = runs["cal_" + src], an["cal_" + src]
        c["every_" + src] = r["config"]["every"]
        # A save's cost inside the run (the save's two steps over the others: robust to load that
        # changes between runs). When that reads 0 or less, the cost is below what the medians can
        # see (an asynchronous write's CPU time spread over the following steps): then the run's
        # mean step over the failure-free run's, times the interval. (Taking 0 made Young/Daly
        # choose a disk save every step for cnn, which cost 23% of that run.)
        between = (x["mean_interval_s"] - an["cal_none"]["mean_interval_s"]) * r["config"]["every"]
        c["C_" + src] = x["save_s"] if x["save_s"] > 0 else max(0.0, between)
        c["Rs_" + src] = [f["gap_s"] - x["t_s"] for f in x["failures"]]
        c["R_" + src] = sum(c["Rs_" + src]) / len(c["Rs_" + src])
    return c


def interval(c, src, mttf, step_s=None):
    """Young/Daly's interval in steps for `src` at `mttf` steps (step_s: another step time)."""
    t = step_s or c["t"]
    return max(1, round(cm.daly_interval(c["C_" + src] / t, mttf))) if c["C_" + src] > 0 else 1


def report(a):
    c = calibrate(a.dir)
    t, an = c["t"], c["an"]
    runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(os.path.join(a.dir, "*.json")))}
    an.update({n: analyse(r) for n, r in runs.items() if n not in an})
    print("## Calibration (failure-free step time, save costs, restart; each from its own run of this invocation)")
    print(f"step time t (mean interval, no checkpoints)            {t * 1e3:9.2f} ms   ({c['steps']} steps, "
          f"median {median([d for d in an['cal_none']['all']]) * 1e3:.2f} ms)")
    for src, what in (("mem", "memory snapshot"), ("disk", "disk checkpoint")):
        x = an["cal_" + src]
        print(f"{what} every {c['every_' + src]} steps: cost C per save   {c['C_' + src] * 1e3:9.2f} ms   "
              f"(the save's step and the next, over the other steps: {x['t_s'] * 1e3:.2f} ms in that run)")
    for src, what in (("mem", "memory"), ("disk", "disk  ")):
        print(f"restart R from {what} (kill -> next step line, less t) {c['R_' + src]:9.3f} s    per failure: "
              + " ".join(f"{x:.2f}" for x in c["Rs_" + src]))
    fl = an["cal_mem"]["failures"] + an["cal_disk"]["failures"]
    part = lambda k: median([f[k] for f in fl])  # noqa: E731
    print(f"# restart's parts (median of the calibration failures): kill -> the script sees the step fail "
          f"{part('to_failed_s'):.2f} s, -> the relaunch line (probes, plans) {part('to_launch_s'):.2f} s, "
          f"-> its first step line (mpirun, start, recovery, one step) {part('launch_to_step_s'):.2f} s")
    print()
    print("## Measured against predicted: effective training time ratio = useful step time / wall time")
    print("# useful = (N - 1) x t, t: the run's own mean step time away from saves (the steps two past a save);")
    print("# wall = its first step line to step N (every relaunch, lost step and save inside);")
    print("# predicted a priori: jobs/costmodel.py run_with_failures with the calibration above and the expected")
    print("# failure count; 'given n': the same with the n failures that came (the model's terms without the dice).")
    print(f"{'run':<12} {'MTTF':>5} {'every':>5} {'N':>5} {'t ms':>5} {'fail':>4} {'lost/f':>6} {'max':>3} {'R s':>5} {'wall s':>7} "
          f"{'measured':>8} {'predicted':>9} {'given n':>8} {'pred/meas':>9}  goal")
    for name in sorted((n for n in runs if not n.startswith("cal_")), key=lambda n: (runs[n]["mttf"], n)):
        r, x = runs[name], an[name]
        src, every = r["config"]["source"], r["config"]["every"]
        n_steps = x["final_step"] - 1
        tr = x["t_s"] if every >= 3 else t  # this run's own step time (below 3, no step is free of a save)
        meas = n_steps * tr / x["wall_s"]
        args = (n_steps, tr, r["mttf"], c["R_" + src], every, c["C_" + src])
        pred, given = cm.run_with_failures(*args), cm.run_with_failures(*args, failures=len(x["failures"]))
        fl = x["failures"]
        lost = sum(f["lost"] for f in fl) / len(fl) if fl else float("nan")
        lmax = max((f["lost"] for f in fl), default=0)  # memory: at most `every` (docs/checkpoints.md)
        rs = median([f["gap_s"] - t for f in fl]) if fl else float("nan")
        goal = ">= 0.95" if r["mttf"] == 200 else ""
        print(f"{name:<12} {r['mttf']:>5g} {every:>5} {n_steps:>5} {tr * 1e3:>5.1f} {len(fl):>4} {lost:>6.2f} {lmax:>3} {rs:>5.2f} "
              f"{x['wall_s']:>7.1f} {meas:>8.3f} {pred['ratio']:>9.3f} {given['ratio']:>8.3f} "
              f"{given['ratio'] / meas:>9.3f}  {goal}")
    print("# goals: ratio >= 0.95 at MTTF 200 steps; prediction within 5% of the measurement (pred/meas 0.95-1.05)")
    print()
    print("## The model for longer steps: the restart R and the save costs C above (seconds), MTTF 200 steps,")
    print("## each source at its Young/Daly interval; 'R for 0.95': the restart that would give 0.95 from memory")
    print(f"{'step s':>7} {'memory':>7} {'every':>5} {'disk':>7} {'every':>5} {'R for 0.95':>11}")
    for ts in (t, 0.5, 1.0, 2.0, 5.0, 10.0):
        km, kd = interval(c, "mem", 200, ts), interval(c, "disk", 200, ts)
        mem = cm.run_with_failures(10000, ts, 200, c["R_mem"], km, c["C_mem"])["ratio"]
        dsk = cm.run_with_failures(10000, ts, 200, c["R_disk"], kd, c["C_disk"])["ratio"]
        base = cm.run_with_failures(10000, ts, 200, 0.0, km, c["C_mem"])  # wall is linear in R
        r95 = (10000 * ts / 0.95 - base["wall_s"]) / base["failures"]
        r95s = f"{r95:9.2f} s" if r95 > 0 else "  unreachable"
        print(f"{ts:>7.3f} {mem:>7.3f} {km:>5d} {dsk:>7.3f} {kd:>5d} {r95s:>11}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("monitor")
    m.add_argument("--out", required=True, help="the job's output file")
    m.add_argument("--json", required=True, help="where the timeline goes")
    m.add_argument("--name", required=True)
    m.add_argument("--nodes", required=True, help="the nodes' network namespaces, in rank order")
    m.add_argument("--memdir", default="", help="checkpoint.memory_dir (node-e<i> removed with node i)")
    m.add_argument("--mttf", type=float, default=0, help="mean executed steps between failures (0: none)")
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--at", default="", help="fixed executed-step counts between failures instead")
    m.add_argument("--config", default="", help="JSON stored with the run (source, every)")
    m.add_argument("--timeout", type=float, default=900)
    r = sub.add_parser("report")
    r.add_argument("dir")
    a = ap.parse_args()
    return monitor(a) if a.cmd == "monitor" else report(a)


if __name__ == "__main__":
    sys.exit(main())
