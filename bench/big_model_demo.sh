#!/usr/bin/env bash
# The demonstration of issue 30: a model one rank cannot hold in 2.4 GB trains
# at 4 ranks with every rank below it, at three layouts, each with block
# recomputation, on the CLI users run (Fashion-MNIST, AdamW, one thread per rank):
#   bench/big_model_demo.sh [BUILD_DIR] [OUT_TXT]   (root: mpirun gets --allow-run-as-root)
#  1. memory: vit width 1536, depth 8, 12 heads, 7x7 patches (16 tokens),
#     global batch 192 (226M parameters; AdamW state 3.6 GB), every process
#     under /usr/bin/time -v: 1 rank with no memory feature, then
#     ZeRO-3 over 4 (data 4), tensor 4 + sequence parallelism, pipeline 4
#     (1F1B, 4 micro-batches, stages cut by parameter count), each with train.recompute = block; MEM_STEPS
#     (default 2) steps each. Printed: the largest rank's peak RSS, against
#     1 rank's and against the 2.4 GB limit.
#  2. losses: the same code path at width 256 (LOSS_STEPS, default 20, steps,
#     global batch 32, dropout 0.1): each layout's per-step loss against the
#     1-rank run of the same settings; the issue's bound is 1e-5.
# MEM_WIDTH / MEM_BATCH shrink part 1 for a quick check. LAYOUTS (default "zero3 tensor4 pipeline4") picks the 4-rank layouts.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-/dev/stdout}
MEM_STEPS=${MEM_STEPS:-2} LOSS_STEPS=${LOSS_STEPS:-20}
MEM_WIDTH=${MEM_WIDTH:-1536} MEM_BATCH=${MEM_BATCH:-192}  # smaller for a quick check of the script
LAYOUTS=${LAYOUTS:-"zero3 tensor4 pipeline4"}
MPI=(mpirun --bind-to none --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
BASE=(train --model vit --set model.depth=8 --set model.patch=7 --threads 1 --optimizer adamw --lr 1e-4
      --no-eval --set log.format=json --set log.interval=1)
BIG=(--set model.width="$MEM_WIDTH" --set model.heads=12 --set data.global_batch="$MEM_BATCH" --max-steps "$MEM_STEPS")
SMALL=(--set model.width=256 --set model.heads=8 --set model.dropout=0.1 --set data.global_batch=32
       --max-steps "$LOSS_STEPS")
layout_keys() {  # the keys of one 4-rank layout
  case $1 in
    zero3) echo "--set parallel.zero=3" ;;
    tensor4) echo "--set parallel.tensor=4 --set parallel.sequence=true" ;;
    pipeline4) echo "--set parallel.pipeline=4 --set parallel.partition=params" ;;
    *) echo "unknown layout $1" >&2; exit 2 ;;
  esac
}
# WORK=DIR keeps the runs there and skips those already done (a later layout
# joins an earlier 1-rank run); without it they go to a removed temporary.
if [[ -n ${WORK:-} ]]; then TMP=$WORK; mkdir -p "$TMP"; else TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT; fi
# 1 rank: no memory feature.
if [[ ! -s $TMP/loss-1rank.log ]]; then
  /usr/bin/time -v -o "$TMP/mem-1rank.time.0" "$BUILD/ringtrain" "${BASE[@]}" "${BIG[@]}" > "$TMP/mem-1rank.log" 2>&1
  echo "done: memory, 1 rank" >&2
  "$BUILD/ringtrain" "${BASE[@]}" "${SMALL[@]}" > "$TMP/loss-1rank.log" 2>&1
  echo "done: losses, 1 rank" >&2
fi
for l in $LAYOUTS; do
  [[ -s $TMP/loss-$l.log ]] && continue
  # shellcheck disable=SC2046
  "${MPI[@]}" -np 4 bash -c '/usr/bin/time -v -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$TMP/mem-$l.time" \
    "$BUILD/ringtrain" "${BASE[@]}" "${BIG[@]}" $(layout_keys "$l") --set train.recompute=block > "$TMP/mem-$l.log" 2>&1
  echo "done: memory, $l" >&2
  # shellcheck disable=SC2046
  "${MPI[@]}" -np 4 "$BUILD/ringtrain" "${BASE[@]}" "${SMALL[@]}" $(layout_keys "$l") --set train.recompute=block \
    > "$TMP/loss-$l.log" 2>&1
  echo "done: losses, $l" >&2
done
/usr/bin/python3 - "$TMP" "$LAYOUTS" "$MEM_STEPS" "$LOSS_STEPS" > "$OUT" <<'PY'
import glob, json, re, sys
tmp, layouts, mem_steps, loss_steps = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
def rss(name):  # MB per rank, from /usr/bin/time -v
    return [int(re.search(r'Maximum resident set size \(kbytes\): (\d+)', open(f).read()).group(1)) / 1024
            for f in sorted(glob.glob(f"{tmp}/mem-{name}.time.*"))]
def losses(name):
    ev = [json.loads(l) for l in open(f"{tmp}/loss-{name}.log") if l.startswith('{') and '"step"' in l]
    return {e['step']: e['loss'] for e in ev if e.get('event') == 'step'}
def first_line(name):
    return next((l.strip() for l in open(f"{tmp}/mem-{name}.log") if l.startswith('ringtrain:')), '?')
names = {'1rank': '1 rank, no memory feature', 'zero3': 'ZeRO-3 over 4 + recompute block',
         'tensor4': 'tensor 4 + sequence + recompute block', 'pipeline4': 'pipeline 4 + recompute block'}
print(f"CPU: {cpu}")
print(f"model: {first_line('1rank')}")
print(f"memory: {mem_steps} steps per layout; losses: {loss_steps} steps at width 256 against 1 rank's")
base_rss, base_loss = max(rss('1rank')), losses('1rank')
print(f"{'layout':40} {'peak RSS MB per rank':>28} {'largest':>8} {'x 1 rank':>8} {'< 2.4 GB':>8} {'max |dloss|':>11}")
for name in ['1rank'] + layouts:
    r = rss(name)
    if name == '1rank':
        d = '-'
    else:
        lo = losses(name)
        common = [s for s in base_loss if s in lo]
        d = (f"{max(abs(lo[s] - base_loss[s]) for s in common):.1e}" if len(common) == int(loss_steps)
             else f"only {len(common)} steps")
    ok = 'yes' if max(r) < 2400 else 'NO'
    print(f"{names[name]:40} {' '.join(f'{x:.0f}' for x in r):>28} {max(r):8.0f} {max(r) / base_rss:8.2f} {ok:>8} {d:>11}")
PY
