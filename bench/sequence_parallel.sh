#!/usr/bin/env bash
# Sequence parallelism (parallel.sequence) against tensor parallelism alone:
#   bench/sequence_parallel.sh [BUILD_DIR] [CSV] [TIME_RUNS]   (root: mpirun gets --allow-run-as-root)
# vit width 512, depth 8, 8 heads, global batch 32, 28x28 images in 2x2
# patches (196 tokens: 2 and 4 divide them) with bench_parallel_memory:
#  1. memory: 1 rank, tensor 2 and tensor 4, each without and with sequence
#     parallelism; the largest rank's peak RSS and activation bytes (host
#     tensor peak minus parameters, gradients and optimizer state) as
#     fractions of 1 rank, beside Korthikanti et al. (2022)'s per-layer
#     activation formula: sbh(10 + 24/t + 5as/(ht)) without, sbh/t (34 + 5as/h)
#     with, both over sbh(34 + 5as/h) at 1 rank.
#  2. time: tensor 2 without / with, TIME_RUNS (default 5) interleaved runs of
#     4 steps each, by default in 7x7 patches (16 tokens: a 196-token step
#     takes a minute on 2 shared cores; TIME_PATCH=2 TIME_BATCH=8 for 196
#     tokens); per run the median step after the first, then the median over
#     the runs. LAYOUTS="" skips part 1.
set -euo pipefail
BUILD=${1:-build}
CSV=${2:-/tmp/sequence_parallel.csv}  # appended to (rows say what they measured)
RUNS=${3:-5}
TIME_PATCH=${TIME_PATCH:-7} TIME_BATCH=${TIME_BATCH:-32}
BIN=$BUILD/bench/bench_parallel_memory
MPI=(mpirun --bind-to none --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
ARGS=(--model vit --patch 2 --batch 32)
first=--header
[[ -s $CSV ]] && first=
LAYOUTS=${LAYOUTS-"1:off 2:off 2:on 4:off 4:on"}  # LAYOUTS="" skips the memory runs
for layout in $LAYOUTS; do
  layout=${layout/:/ }
  set -- $layout
  seq=(); [[ $2 == on ]] && seq=(--sequence)
  echo "== memory: tensor $1, sequence $2" >&2
  "${MPI[@]}" -np "$1" "$BIN" "${ARGS[@]}" --tensor "$1" "${seq[@]}" --steps 2 $first | sed 's/$/,memory/' >> "$CSV"
  first=
done
for run in $(seq "$RUNS"); do
  for s in off on; do
    seq=(); [[ $s == on ]] && seq=(--sequence)
    echo "== time run $run: tensor 2, sequence $s" >&2
    "${MPI[@]}" -np 2 "$BIN" --model vit --patch "$TIME_PATCH" --batch "$TIME_BATCH" --tensor 2 "${seq[@]}" --steps 4 $first | sed 's/$/,time/' >> "$CSV"
    first=
  done
done
/usr/bin/python3 - "$CSV" <<'PY'
import csv, statistics, sys
lines = open(sys.argv[1]).read().splitlines()
head = lines[0].rsplit(',', 1)[0].split(',') + ['kind']
rows = [dict(zip(head, l.split(','))) for l in lines[1:]]
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
print(f"CPU: {cpu}; CSV: {sys.argv[1]}")
s, h, a = 196, 512, 8
k1 = 34 + 5 * a * s / h
def formula(t, sp):
    return (34 + 5 * a * s / h) / t / k1 if sp else (10 + 24 / t + 5 * a * s / (h * t)) / k1
mem = [r for r in rows if r['kind'] == 'memory']
top = lambda rs, key: max(float(r[key]) for r in rs)
base = [r for r in mem if r['tensor'] == '1']
b_rss, b_act = (top(base, 'peak_rss_mb'), top(base, 'activations_b') / 2**20) if base else (1, 1)
if mem: print(f"{'layout':28} {'peak RSS MB':>11} {'x 1 rank':>8} {'act. MB':>8} {'x 1 rank':>8} {'formula':>7}")
for t in ('1', '2', '4'):
    for sp in ('0', '1'):
        rs = [r for r in mem if r['tensor'] == t and r['sequence'] == sp]
        if not rs: continue
        rss, act = top(rs, 'peak_rss_mb'), top(rs, 'activations_b') / 2**20
        name = f"tensor {t}" + ('' if t == '1' else (' + sequence' if sp == '1' else ' alone'))
        print(f"{name:28} {rss:11.0f} {rss / b_rss:8.2f} {act:8.0f} {act / b_act:8.2f} {formula(int(t), sp == '1'):7.2f}")
if mem: print("formula: Korthikanti et al. per-layer activations, a = 8 heads, s = 196 tokens, h = 512, over 1 rank's")
for sp in ('0', '1'):
    runs = [float(r['step_s']) for r in rows if r['kind'] == 'time' and r['sequence'] == sp and r['rank'] == '0']
    if runs:
        print(f"tensor 2, {'with' if sp == '1' else 'without'} sequence parallelism: median step "
              f"{statistics.median(runs):.3f} s over {len(runs)} runs ({', '.join(f'{x:.3f}' for x in runs)})")
PY
