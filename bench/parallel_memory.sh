#!/usr/bin/env bash
# Memory per rank under each layout against its ideal, on the trainer users
# run (bench_parallel_memory, one process set per layout: peak RSS is per process).
#   bench/parallel_memory.sh [BUILD_DIR] [CSV]   (root: mpirun gets --allow-run-as-root)
# For vit (width 512, depth 8, 8 heads, global batch 32) and resnet: 1 rank,
# pipeline 2 and 4, tensor 2 and 4, pipeline 2 x tensor 2, and data parallelism
# over 2 and 4 ranks with parallel.zero = 0, 1, 2, 3 (comm.algorithm = ring, so
# every gradient byte goes through the counted primitives).
# Prints per layout the largest rank's peak RSS and its parameter + gradient +
# optimizer bytes as fractions of the 1-rank run, beside the ideal: 1/(PP·TP)
# for model parallelism; the ZeRO paper's P + G + O/N (ZeRO-1),
# P + (G + O)/N (ZeRO-2) and (P + G + O)/N (ZeRO-3), with P, G, O the 1-rank
# run's; the gradient buckets in flight (full-buffer bytes resident at once)
# and ZeRO-3's gathered layers in flight as separate terms. Then the bytes a
# rank sends per step against the ring all-reduce's 2(N-1)/N·G (ZeRO-3: two
# parameter all-gathers and a reduce-scatter, 3(N-1)/N·G = 1.5x).
#   ZERO_ONLY=1 bench/parallel_memory.sh   runs only the data-parallel ZeRO rows (and the 1-rank base)
#   ZEROS="0 3" picks the ZeRO stages of those rows (default 0 1 2 3)
set -euo pipefail
BUILD=${1:-build}
CSV=${2:-docs/data/parallel_memory.csv}
BIN=$BUILD/bench/bench_parallel_memory
MPI=(mpirun --bind-to none --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
mkdir -p "$(dirname "$CSV")"
first=--header
: > "$CSV"
for model in ${MODELS:-vit resnet}; do
  layouts=("1 1 1" "2 2 1" "4 4 1" "2 1 2" "4 1 4" "4 2 2")
  [[ ${ZERO_ONLY:-0} == 1 ]] && layouts=("1 1 1")
  for n in 2 4; do for z in ${ZEROS:-0 1 2 3}; do layouts+=("$n 1 1 --zero $z --algorithm ring"); done; done
  for layout in "${layouts[@]}"; do
    set -- $layout
    np=$1 pp=$2 tp=$3; shift 3
    echo "== $model: $np rank(s), pipeline $pp, tensor $tp $*" >&2
    "${MPI[@]}" -np "$np" "$BIN" --model "$model" --pipeline "$pp" --tensor "$tp" "$@" $first >> "$CSV"
    first=
  done
done
/usr/bin/python3 - "$CSV" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
print(f"CPU: {cpu}; CSV: {sys.argv[1]}")
print(f"{'model':7} {'layout':22} {'peak RSS MB':>11} {'x 1 rank':>8} {'params+grads+opt B':>19} {'x 1 rank':>8} {'ideal':>6} {'act MB':>7}")
for model in sorted({r['model'] for r in rows}, reverse=True):
    mine = [r for r in rows if r['model'] == model]
    base = [r for r in mine if r['ranks'] == '1'][0]
    held = lambda r: int(float(r['params_b']) + float(r['grads_b']) + float(r['optimizer_b']))
    for key in sorted({(r['ranks'], r['pipeline'], r['tensor'], r['zero']) for r in mine}, key=lambda k: (int(k[0]), k[3], k)):
        rs = [r for r in mine if (r['ranks'], r['pipeline'], r['tensor'], r['zero']) == key]
        top = max(rs, key=lambda r: float(r['peak_rss_mb']))
        big = max(rs, key=held)
        pp, tp, dp = int(key[1]), int(key[2]), int(key[0]) // (int(key[1]) * int(key[2]))
        if pp * tp == 1 and dp > 1:
            P, G, O = (float(base[k]) for k in ('params_b', 'grads_b', 'optimizer_b'))
            z = int(key[3])
            ideal = ((P + G + O / dp) if z == 1 else (P + (G + O) / dp) if z == 2 else
                     (P + G + O) / dp if z == 3 else (P + G + O)) / held(base)
            name = f"ZeRO-{z} over {dp} ranks"
        else:
            ideal = 1 / (pp * tp)
            name = f"{key[0]} rank(s): PP {pp} x TP {tp}"
        print(f"{model:7} {name:22} {float(top['peak_rss_mb']):11.0f} {float(top['peak_rss_mb'])/float(base['peak_rss_mb']):8.2f} "
              f"{held(big):19d} {held(big)/held(base):8.3f} {ideal:6.3f} {float(big['activations_b'])/2**20:7.1f}"
              + (f"  + buckets in flight {float(big['grads_in_flight_b'])/2**20:.2f} MB" if key[3] in ('2', '3') else "")
              + (f"  + gathered layers in flight {float(big.get('params_in_flight_b') or 0)/2**20:.2f} MB" if key[3] == '3' else ""))
    print(f"{model}: bytes sent per step by the largest sender (comm.algorithm = ring) against 2(N-1)/N x G (ZeRO-3: 3(N-1)/N x G):")
    G = float(base['grads_b'])
    for n in ('2', '4'):
        dp0 = None
        for z in ('0', '1', '2', '3'):
            rs = [r for r in mine if (r['ranks'], r['pipeline'], r['tensor'], r['zero']) == (n, '1', '1', z)]
            if not rs: continue
            sent = max(float(r['sent_per_step_b']) for r in rs)
            dp0 = sent if z == '0' else dp0
            formula = (3 if z == '3' else 2) * (int(n) - 1) / int(n) * G
            print(f"  {n} ranks ZeRO-{z}: {sent/2**20:9.3f} MB  formula {formula/2**20:9.3f} MB  x formula {sent/formula:6.3f}"
                  + (f"  x plain data parallelism {sent/dp0:6.3f}" if dp0 else ""))
PY
