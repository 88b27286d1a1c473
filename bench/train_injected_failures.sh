#!/usr/bin/env bash
# Effective training time under injected failures (issue 46, item 2), measured on the emulated
# Slurm cluster (tests/slurm/cluster.sh: 3 nodes, each a network namespace, one rank per node) and
# predicted by the cost model (jobs/costmodel.py: run_with_failures), side by side.
#   bench/train_injected_failures.sh [RINGTRAIN_BIN]        (root, Slurm and munge: as tests/slurm)
# Environment: MTTFS (default "50 200 1000": mean executed steps between failures), STEPS (useful
# steps of each measured run, one per MTTF, default "300 1000 2000"), SEED (default 46), CAL_STEPS
# (default 300), OUT (where the runs' JSON timelines go; default a temporary directory), MODEL
# (default mlp) and BATCH (data.global_batch, default 48): the step time t the failures are
# measured against; KILL_GRACE_S (jobs/sbatch_elastic.sh's, default 0); SOURCES (the measured rows'
# snapshot sources, default "mem disk").
#
# Every job is jobs/sbatch_elastic.sh training MODEL + AdamW on Fashion-MNIST (global batch BATCH,
# a third per rank), MIN_NODES=3: a failure kills one node's ranks (bench/injected_failures.py monitor: its
# `ringtrain` processes, kill -9, and its in-memory snapshots), slurmd stays, and the script relaunches
# on the same 3 nodes with --resume auto. Failures come after an exponentially distributed number of
# executed steps (mean MTTF, seeded; restarts do not count). Runs, in order:
#   calibration: cal_none (no checkpoints: the step time t), cal_mem (a memory snapshot every 5 steps,
#     3 failures 50 executed steps apart: the cost of a snapshot and the restart from memory), cal_disk
#     (a disk checkpoint every 5 steps, the same failures: the save cost and the restart from disk);
#   measured, per MTTF: mem_M<M> and disk_M<M>, each at the Young/Daly interval for its own measured
#     cost C and M (daly_interval(C/t, M) steps; a snapshot costs about as much as a small model's
#     disk save here: the helper's fixed costs on 2 shared cores, see docs/checkpoints.md).
# Then `injected_failures.py report` prints the table (calibration, measured vs predicted, goals).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath "${1:-$ROOT/build/ringtrain}")
if [ "${RT_INJ_INSIDE:-}" != 1 ]; then
    export RT_SLURM_NAME=${RT_SLURM_NAME:-rtinj} RT_SLURM_SUBNET=${RT_SLURM_SUBNET:-10.77.39}
    export RT_SLURM_PORT=${RT_SLURM_PORT:-18300} OMPI_MCA_btl_vader_single_copy_mechanism=none
    RT_INJ_INSIDE=1 exec "$ROOT/tests/slurm/cluster.sh" run 3 -- "$0" "$BIN"
fi
SRC=$ROOT
WORK=$(mktemp -d /tmp/rt-injfail.XXXXXX)
MEM=/dev/shm/$(basename "$WORK")
trap 'rm -rf "$WORK" "$MEM"' EXIT
. "$ROOT/tests/slurm/lib.sh"
OUT=${OUT:-$WORK/json}
mkdir -p "$OUT"
MTTFS=(${MTTFS-50 200 1000})
STEPS=(${STEPS:-300 1000 2000})
SEED=${SEED:-46} CAL_STEPS=${CAL_STEPS:-300} CAL_EVERY=5
MODEL=${MODEL:-mlp} BATCH=${BATCH:-48} KILL_GRACE_S=${KILL_GRACE_S:-0}
SOURCES=(${SOURCES:-mem disk})
PY=/usr/bin/python3
NODES=${RT_SLURM_NAME}1,${RT_SLURM_NAME}2,${RT_SLURM_NAME}3
[ -f "$SRC/data/fashion-mnist/fashion-mnist-train.h5" ] ||
    "$BIN" prepare --dataset fashion-mnist --out "$SRC/data/fashion-mnist" >/dev/null || exit 1
echo "# $(date -u +%FT%TZ) $(hostname): $(nproc) cores, $(uptime | sed 's/.*load/load/')"
echo "# bench/train_injected_failures.sh: MTTFS=${MTTFS[*]} STEPS=${STEPS[*]} SEED=$SEED CAL_STEPS=$CAL_STEPS MODEL=$MODEL BATCH=$BATCH KILL_GRACE_S=$KILL_GRACE_S"
common=(--set model.name="$MODEL" --set optimizer.name=adamw --set optimizer.nesterov=false --set optimizer.lr=0.001 --set data.global_batch="$BATCH"
        --set train.epochs=100 --set log.interval=1 --set checkpoint.keep=3 --no-eval)

# run NAME SOURCE(none|mem|disk) EVERY STEPS [monitor args]: one job, followed by the monitor.
run() {
    local name=$1 src=$2 every=$3 steps=$4; shift 4
    local ck=(--set checkpoint.every_steps=0)
    case $src in
        mem) ck+=(--set checkpoint.memory_every_steps="$every" --set checkpoint.memory_node_ranks=1
                  --set checkpoint.memory_dir="$MEM/$name") ;;
        disk) ck=(--set checkpoint.every_steps="$every") ;;
    esac
    local id
    id=$(CKPT_DIR=$WORK/$name BIN=$BIN MAX_RELAUNCHES=1000 MIN_NODES=3 PROBE_S=10 KILL_GRACE_S=$KILL_GRACE_S \
         submit -N 3 --ntasks-per-node=1 --cpus-per-task=1 --time=00:30:00 --output="$WORK/$name.out" \
         jobs/sbatch_elastic.sh "${common[@]}" --set train.max_steps="$steps" "${ck[@]}") || { echo "sbatch failed"; return 1; }
    "$PY" "$ROOT/bench/injected_failures.py" monitor --out "$WORK/$name.out" --json "$OUT/$name.json" --name "$name" \
        --nodes "$NODES" --memdir "$MEM/$name" --config "{\"source\": \"$src\", \"every\": $every}" "$@"
    local state; state=$(wait_job "$id" 120)
    echo "$name: job $id $state; $(grep -c '^\[sbatch_elastic.*launch [0-9]*:' "$WORK/$name.out") launch(es); $(grep -h 'training finished' "$WORK/$name.out" | sed 's/^\[sbatch_elastic [0-9:]*\] //')"
    [ "$state" = COMPLETED ] || { tail -30 "$WORK/$name.out"; return 1; }
}

run cal_none none 1 "$CAL_STEPS" || exit 1
run cal_mem mem $CAL_EVERY "$CAL_STEPS" --at 50,50,50 || exit 1
run cal_disk disk $CAL_EVERY "$CAL_STEPS" --at 50,50,50 || exit 1
# The Young/Daly interval per MTTF and source, from the calibration (C and t in steps).
every() {  # every SOURCE MTTF
    "$PY" -c "
import sys, json; sys.path[:0] = ['$ROOT/bench', '$ROOT/jobs']
import injected_failures as f
print(f.interval(f.calibrate('$OUT'), '$1', $2))"
}
for i in "${!MTTFS[@]}"; do
    m=${MTTFS[$i]} n=${STEPS[$i]:-${STEPS[-1]}}
    km=$(every mem "$m") kd=$(every disk "$m")
    echo "MTTF $m steps: memory snapshot every $km steps, disk checkpoint every $kd (Young/Daly), $n steps per run"
    for src in "${SOURCES[@]}"; do
        k=$km; [ "$src" = disk ] && k=$kd
        run "${src}_M$m" "$src" "$k" "$n" --mttf "$m" --seed $((SEED + i)) || exit 1
    done
done
echo
"$PY" "$ROOT/bench/injected_failures.py" report "$OUT"
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')"
