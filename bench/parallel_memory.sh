#!/usr/bin/env bash
# Memory per rank under each layout and activation recomputation mode against
# its ideal, on the trainer users run (bench_parallel_memory, one process set
# per run: peak RSS is per process).
#   bench/parallel_memory.sh [BUILD_DIR] [CSV]   (root: mpirun gets --allow-run-as-root)
# For vit (width 512, depth 8, 8 heads, global batch 32, patch PATCH: 2 gives 196
# tokens, which sequence parallelism at tensor 4 needs) and resnet (ResNet-20):
# 1 rank, pipeline 2 and 4, tensor 2 and 4 without and with sequence
# parallelism, pipeline 2 x tensor 2 (without and with sequence), and data
# parallelism over ZERO_RANKS ranks with parallel.zero in ZEROS
# (comm.algorithm = ring, so every gradient byte goes through the counted
# primitives); each with train.recompute in RECOMPUTE. resnet skips the
# sequence layouts and recompute = attention (it has neither tokens nor attention).
# Prints per run the largest rank's peak RSS, its parameter + gradient +
# optimizer bytes and its activation bytes (host tensor peak minus that state),
# each against the 1-rank run with recompute none, beside the ideal:
#  - state: 1/(PP*TP) for model parallelism; the ZeRO paper's P + G + O/N (ZeRO-1),
#    P + (G + O)/N (ZeRO-2) and (P + G + O)/N (ZeRO-3), with P, G, O the 1-rank run's;
#    the gradient buckets in flight (full-buffer bytes resident at once) and
#    ZeRO-3's gathered layers in flight as separate terms;
#  - activations (vit): Korthikanti et al. (2022)'s per-layer formula in the
#    form ringtrain's fp32 blocks without dropout keep (bench/memory_formula.py);
#  - recompute: the step time against the same layout's recompute = none run.
# Then the bytes a rank sends per step against the ring all-reduce's 2(N-1)/N*G
# (ZeRO-3: two parameter all-gathers and a reduce-scatter, 3(N-1)/N*G = 1.5x).
# Knobs (environment):
#   MODELS="vit resnet"   RECOMPUTE="none attention block"   STEPS=2   PATCH=2
#   LAYOUTS="1 pp2 pp4 tp2 tp2seq tp4 tp4seq pp2tp2 pp2tp2seq"   (the 1-rank base always runs)
#   ZEROS="0 1 2 3" ZERO_RANKS="2 4": the data-parallel ZeRO rows (ZEROS="" for none)
#   ZERO_ONLY=1: only the 1-rank base and the ZeRO rows, with RECOMPUTE=none and PATCH=4 unless set
#   BREAKDOWN=DIR: each run also writes DIR/<model>-<layout>-<recompute>.<rank>, the host tensor
#     bytes live at the rank's peak per allocating site (slow: a backtrace per allocation)
set -euo pipefail
BUILD=${1:-build}
CSV=${2:-docs/data/parallel_memory.csv}
BIN=$BUILD/bench/bench_parallel_memory
HERE=$(cd "$(dirname "$0")" && pwd)
MPI=(mpirun --bind-to none --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
if [[ ${ZERO_ONLY:-0} == 1 ]]; then
  LAYOUTS=${LAYOUTS-}; RECOMPUTE=${RECOMPUTE:-none}; PATCH=${PATCH:-4}
else
  LAYOUTS=${LAYOUTS-1 pp2 pp4 tp2 tp2seq tp4 tp4seq pp2tp2 pp2tp2seq}; RECOMPUTE=${RECOMPUTE:-none attention block}
  PATCH=${PATCH:-2}
fi
declare -A SPEC=([1]="1 --pipeline 1" [pp2]="2 --pipeline 2" [pp4]="4 --pipeline 4" [tp2]="2 --tensor 2"
  [tp2seq]="2 --tensor 2 --sequence" [tp4]="4 --tensor 4" [tp4seq]="4 --tensor 4 --sequence"
  [pp2tp2]="4 --pipeline 2 --tensor 2" [pp2tp2seq]="4 --pipeline 2 --tensor 2 --sequence")
mkdir -p "$(dirname "$CSV")"
[[ -n ${BREAKDOWN:-} ]] && mkdir -p "$BREAKDOWN"
first=--header
: > "$CSV"
for model in ${MODELS:-vit resnet}; do
  names=(1)
  for l in $LAYOUTS; do
    [[ -n ${SPEC[$l]:-} ]] || { echo "LAYOUTS: unknown layout '$l' (known: ${!SPEC[*]})" >&2; exit 2; }
    [[ $l == 1 || ($model == resnet && $l == *seq) ]] || names+=("$l")
  done
  for n in ${ZERO_RANKS:-2 4}; do for z in ${ZEROS-0 1 2 3}; do
    names+=("zero${z}x$n"); SPEC[zero${z}x$n]="$n --zero $z --algorithm ring"
  done; done
  for rc in $RECOMPUTE; do
    [[ $model == resnet && $rc == attention ]] && continue
    for name in "${names[@]}"; do
      # shellcheck disable=SC2086
      set -- ${SPEC[$name]}
      np=$1; shift
      extra=()
      [[ -n ${BREAKDOWN:-} ]] && extra=(--breakdown "$BREAKDOWN/$model-$name-$rc")
      echo "== $model $name (recompute $rc): $np rank(s) $*" >&2
      "${MPI[@]}" -np "$np" "$BIN" --model "$model" --patch "$PATCH" --steps "${STEPS:-2}" --recompute "$rc" "$@" \
        "${extra[@]}" $first >> "$CSV"
      first=
    done
  done
done
/usr/bin/python3 "$HERE/memory_formula.py" "$CSV"
