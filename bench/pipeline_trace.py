#!/usr/bin/env python3
"""Where a pipeline step's time goes, from a log.trace_steps trace of 2 pipeline ranks
(docs/data/pipeline_trace_waits.txt has the commands and the output):
  bench/pipeline_trace.py waits  TRACE.json LABEL   per rank and step: compute, receive waits, send waits
  bench/pipeline_trace.py replay TRACE.json MSG_MS  each step replayed with its own / the mean action times
  bench/pipeline_trace.py delays TRACE.json         how long after its send a waiting receive returned
  bench/pipeline_trace.py messages TRACE.json       per message kind: from its send to its receive's end, and the
                                                    receive's wait, split by whether the receiver was already waiting
  bench/pipeline_trace.py slow     TRACE.json       per rank and action kind: the actions over twice their median,
                                                    the time they added, and when
The window's first step is left out (it starts mid-way through the trace's set-up)."""
import sys
def waits(argv):
    d = json.load(open(argv[0]))
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    print("# %s: rank  step_ms  compute_ms  recv_wait_ms  slot_send_wait_ms  end_send_wait_ms" % argv[1])
    for pid in (0, 1):
        steps = sorted([e for e in ev if e["pid"] == pid and e["cat"] == "step"], key=lambda e: e["ts"])
        for s in steps[1:]:
            ins = [e for e in ev if e["pid"] == pid and e is not s and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
            comp = [e for e in ins if e["cat"] == "compute" and e["name"][0] in "FBIW" and e["name"][1] == " "]
            sends = [e for e in ins if e["name"].startswith("pipeline send")]
            in_f = sum(x["dur"] for x in sends if any(c["ts"] <= x["ts"] <= c["ts"] + c["dur"] for c in comp))
            rw = sum(e["dur"] for e in ins if e["cat"] == "wait" and e["name"].startswith("recv"))
            print("%d %8.1f %8.1f %8.1f %8.1f %8.1f" % (pid, s["dur"] / 1e3, (sum(c["dur"] for c in comp) - in_f) / 1e3,
                  rw / 1e3, in_f / 1e3, (sum(x["dur"] for x in sends) - in_f) / 1e3))

def replay(argv):
    d = json.load(open(argv[0])); msg = float(argv[1]) if len(argv) > 1 else 0.0
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    def steps(pid): return sorted([e for e in ev if e["pid"] == pid and e["cat"] == "step"], key=lambda e: e["ts"])[1:]
    def acts(pid, s):
        ins = sorted([e for e in ev if e["pid"] == pid and e is not s and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]], key=lambda e: e["ts"])
        out = []
        for e in ins:
            m = re.match(r"^(F|B|I|W) (\d+)\.(\d+)$", e["name"])
            if m and e["cat"] == "compute":
                waits = sum(x["dur"] for x in ins if x["name"].startswith("pipeline send") and e["ts"] <= x["ts"] <= e["ts"] + e["dur"])
                out.append(("c", m.group(1), int(m.group(2)), int(m.group(3)), (e["dur"] - waits) / 1e3))
            m = re.match(r"^(send|recv) (activation|gradient) (\d+)\.(\d+)$", e["name"])
            if m: out.append((m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), 0))
        return out
    n = len(steps(0)); pids = (0, 1)
    allacts = {pid: [acts(pid, s) for s in steps(pid)] for pid in pids}
    mean = collections.defaultdict(list)
    for pid in pids:
        for st in allacts[pid]:
            for a in st:
                if a[0] == "c": mean[(a[1], a[2])].append(a[4])
    mean = {k: stt.mean(v) for k, v in mean.items()}
    def replay(k, use_mean):
        L = {pid: allacts[pid][k] for pid in pids}; pc = {p: 0 for p in pids}; clk = {p: 0.0 for p in pids}; sent = {}
        while any(pc[p] < len(L[p]) for p in pids):
            moved = False
            for p in pids:
                while pc[p] < len(L[p]):
                    a = L[p][pc[p]]
                    if a[0] == "c": clk[p] += mean[(a[1], a[2])] if use_mean else a[4]
                    elif a[0] == "send":  # activation s.m goes to stage s+1; gradient s.m to s-1
                        sent[(a[1], a[2] + (1 if a[1] == "activation" else -1), a[3])] = clk[p] + msg
                    else:
                        key = (a[1], a[2], a[3])
                        if key not in sent: break
                        clk[p] = max(clk[p], sent[key])
                    pc[p] += 1; moved = True
            if not moved: return float("nan")
        return max(clk.values())
    print("# %s (message %.2f ms): step  traced_ms  replay_own_durations_ms  replay_mean_durations_ms" % (argv[0].split("/")[-1], msg))
    for k in range(n):
        t = max(steps(p)[k]["dur"] for p in pids) / 1e3
        print("%d %8.1f %8.1f %8.1f" % (k, t, replay(k, False), replay(k, True)))

def delays(argv):
    d = json.load(open(argv[0]))
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    def steps(pid): return sorted([e for e in ev if e["pid"] == pid and e["cat"] == "step"], key=lambda e: e["ts"])[1:]
    delays = []; direct = []
    for k in range(len(steps(0))):
        spans = {}
        for pid in (0, 1):
            s = steps(pid)[k]
            for e in ev:
                if e["pid"] == pid and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]:
                    m = re.match(r"^(send|recv) (activation|gradient) (\d+)\.(\d+)$", e["name"])
                    if m:
                        st, mb = int(m.group(3)), int(m.group(4))
                        if m.group(1) == "send": st = st + 1 if m.group(2) == "activation" else st - 1
                        spans[(m.group(1), m.group(2), st, mb)] = (e["ts"] - s["ts"], e["dur"], pid)
        for key, (ts, dur, pid) in spans.items():
            if key[0] != "recv": continue
            snd = spans.get(("send",) + key[1:])
            if snd and dur > 50:  # waited > 0.05 ms
                delays.append((ts + dur - snd[0]) / 1e3)
    print("%s: %d waiting receives, delay after the send (ms): median %.2f, mean %.2f, p90 %.2f, max %.2f" % (
        argv[0].split("/")[-1], len(delays), stt.median(delays), stt.mean(delays), sorted(delays)[int(0.9 * len(delays))], max(delays)))

def messages(argv):
    # Absolute times: the ranks' steps start up to a few ms apart.
    d = json.load(open(argv[0]))
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    steps = {pid: sorted([e for e in ev if e["pid"] == pid and e["cat"] == "step"], key=lambda e: e["ts"])[1:] for pid in (0, 1)}
    rows = collections.defaultdict(list)
    for k in range(min(len(v) for v in steps.values())):
        sends, recvs = {}, {}
        for pid in (0, 1):
            s = steps[pid][k]
            for e in ev:
                if e["pid"] != pid or not s["ts"] <= e["ts"] <= s["ts"] + s["dur"]: continue
                m = re.match(r"^(send|recv) (activation|gradient) (\d+)\.(\d+)$", e["name"])
                if not m: continue
                st, mb = int(m.group(3)), int(m.group(4))
                if m.group(1) == "send":
                    sends[(m.group(2), st + 1 if m.group(2) == "activation" else st - 1, mb)] = e["ts"] + e["dur"]
                elif e["cat"] == "wait":
                    recvs[(m.group(2), st, mb)] = e
        for key, r in recvs.items():
            if key not in sends: continue
            waiting = r["ts"] <= sends[key]
            cls = "%s %s" % (key[0], "receiver waiting" if waiting else "receiver computing when sent")
            rows[cls].append(((r["ts"] + r["dur"] - sends[key]) / 1e3, r["dur"] / 1e3))
    print("# %s: kind  n  median send->received ms  median receive wait ms  p90 wait ms" % argv[0].split("/")[-1])
    for cls, v in sorted(rows.items()):
        w = sorted(x[1] for x in v)
        print("%-45s %4d %7.2f %7.2f %7.2f" % (cls, len(v), stt.median(x[0] for x in v), stt.median(w), w[int(0.9 * len(w))]))

def slow(argv):
    # Per rank and action kind (F/B/I/W of a chunk): how many took over twice the kind's median,
    # the time they added over it, and when (seconds from the trace's first action).
    d = json.load(open(argv[0]))
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X" and e["cat"] == "compute" and re.match(r"^[FBIW] \d+\.\d+$", e["name"])]
    steps = len([e for e in d["traceEvents"] if e.get("ph") == "X" and e["cat"] == "step" and e["pid"] == 0])
    by = collections.defaultdict(list)
    for e in ev: by[(e["pid"], e["name"].split(".")[0])].append(e)
    t0 = min(e["ts"] for e in ev)
    print("# %s (%d steps): rank kind  n  median_ms  over_2x  added_ms  at_s" % (argv[0].split("/")[-1], steps))
    for (pid, kind), v in sorted(by.items()):
        m = stt.median(e["dur"] for e in v)
        if m < 300: continue  # under 0.3 ms: timer noise
        over = [e for e in v if e["dur"] > 2 * m]
        print("%d %-4s %4d %7.2f %4d %8.1f  %s" % (pid, kind, len(v), m / 1e3, len(over), sum(e["dur"] - m for e in over) / 1e3,
              " ".join("%.2f" % ((e["ts"] - t0) / 1e6) for e in over[:12])))

if __name__ == "__main__":
    import json, re, statistics as stt, collections  # noqa: F401 (used by the functions above)
    globals().update(json=json, re=re, stt=stt, collections=collections)
    {"waits": waits, "replay": replay, "delays": delays, "messages": messages, "slow": slow}[sys.argv[1]](sys.argv[2:])
