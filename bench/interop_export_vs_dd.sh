#!/usr/bin/env bash
# Issue 44's goal "export of the GPT-2 124M shape <= 2x the time of writing the same bytes with dd":
# a checkpoint of gpt at GPT-2 small's shape (768 wide, 12 blocks, 12 heads, 1,024 positions,
# vocabulary 50,257, tanh GELU; 1 step at lr 0), then, alternated REPS times in one run:
#   `dd conv=fsync` writing the export's byte count (475 MiB in 1 MiB blocks) to the same directory,
#   `ringtrain export` (one F32 model.safetensors, fsync'd; the whole command: MPI start-up included),
#   dd again, `ringtrain export --format llmc` (llm.c's model file, 475 MiB, fsync'd).
# Each figure: the median over the repetitions of wall time and of CPU time (user + system, the
# process and its children); the ratios of the medians, against the median of every dd (bound
# 2.0, the wall ratio). The machine may be shared: wall time then includes waiting for a core,
# CPU time does not (and misses the kernel's writeback threads, for dd and export alike).
# BASE (optional): another ringtrain binary (e.g. an older build) whose safetensors export is timed
# in the same rotation, for a before/after in one run.
# Usage: bench/interop_export_vs_dd.sh [BIN] [REPS] [DIR] [BASE]   (output: docs/data/interop_export_vs_dd.txt)
set -euo pipefail
BIN=${1:-build/ringtrain}; REPS=${2:-7}; DIR=${3:-/tmp}; BASE=${4:-}
WORK=$(mktemp -d "$DIR/rt-export.XXXXXX"); trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "# $0 $BIN $REPS $DIR $BASE   ($(date -u +%FT%TZ), $(nproc) cores:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg))"
/usr/bin/python3 -c "import numpy as np; np.save('$WORK/t.npy', np.random.default_rng(0).integers(0, 50257, 40000, dtype=np.int32))"
"$BIN" prepare --dataset tokens --input "$WORK/t.npy" --vocab 50257 --out "$WORK/data" >/dev/null
"$BIN" train --model gpt --set model.width=768 --set model.depth=12 --set model.heads=12 --set model.gelu=tanh \
    --set data.seq_len=1024 --batch-size 1 --threads 2 --train-data "$WORK/data" --test-data "$WORK/data" \
    --optimizer sgd --lr 0 --set optimizer.momentum=0 --max-steps 1 --no-eval --log-format plain \
    --checkpoint-dir "$WORK/run" 2>&1 | grep -E "^ringtrain:"
/usr/bin/python3 - "$BIN" "$WORK" "$REPS" "$BASE" <<'PY'
import os, resource, statistics, subprocess, sys, time
binary, work, reps, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

def timed(cmd):
    """Wall and CPU (user + system of the children) seconds of one command."""
    subprocess.run(["sync"], check=True)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    t1 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return t1 - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)

def dd(nbytes):
    out = os.path.join(work, "dd.bin")
    res = timed(["dd", "if=/dev/zero", f"of={out}", "bs=1M", f"count={(nbytes + 2**20 - 1) // 2**20}",
                 "conv=fsync", "status=none"])
    os.remove(out)
    return res

cases = {"safetensors": ([binary, "export", "--checkpoint", f"{work}/run", "--out", f"{work}/hf"],
                         f"{work}/hf/model.safetensors"),
         "llmc": ([binary, "export", "--checkpoint", f"{work}/run", "--format", "llmc", "--out", f"{work}/m.bin"],
                  f"{work}/m.bin")}
if base:
    cases["safetensors, BASE binary"] = ([base, "export", "--checkpoint", f"{work}/run", "--out", f"{work}/hf"],
                                         f"{work}/hf/model.safetensors")
rows = {k: [] for k in cases}
dds, up, nbytes = [], [], {}
subprocess.run(cases["safetensors"][0], check=True, stdout=subprocess.DEVNULL)  # untimed: the byte count, warm caches
ref_bytes = os.path.getsize(cases["safetensors"][1])
subprocess.run(["rm", "-rf", f"{work}/hf"], check=True)
for r in range(reps):
    for k, (cmd, path) in cases.items():  # dd, export, dd, export: the reference brackets each export
        d = dd(ref_bytes)
        dds.append(d)
        ex = timed(cmd)
        nbytes[k] = os.path.getsize(path)
        subprocess.run(["rm", "-rf", f"{work}/hf", f"{work}/m.bin"], check=True)
        rows[k].append(ex)
        print(f"rep {r + 1} {k}: export {ex[0]:.3f} s wall {ex[1]:.3f} s CPU ({nbytes[k]} bytes);"
              f" dd before it {d[0]:.3f} s wall {d[1]:.3f} s CPU", flush=True)
    up.append(timed([binary, "export", "--help"]))  # start-up alone: MPI_Init, libraries
med = lambda xs, i: statistics.median(x[i] for x in xs)
dw, dc = med(dds, 0), med(dds, 1)
b = ref_bytes
print(f"dd conv=fsync of {(b + 2**20 - 1) // 2**20} MiB: median of {len(dds)}: {dw:.3f} s wall ({b / dw / 1e6:.0f} MB/s),"
      f" {dc:.3f} s CPU")
print(f"ringtrain start-up alone (export --help): median {med(up, 0):.3f} s wall, {med(up, 1):.3f} s CPU")
for k, v in rows.items():
    ew, ec = med(v, 0), med(v, 1)
    print(f"{k}: median of {reps}: export {ew:.3f} s wall ({nbytes[k] / ew / 1e6:.0f} MB/s), {ec:.3f} s CPU:"
          f" wall ratio {ew / dw:.2f} (bound 2.0); CPU ratio {ec / dc:.2f};"
          f" less start-up: wall ratio {(ew - med(up, 0)) / dw:.2f}, CPU ratio {(ec - med(up, 1)) / dc:.2f}")
PY
