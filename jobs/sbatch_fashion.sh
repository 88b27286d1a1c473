#!/usr/bin/env bash
# Slurm job: data-parallel Fashion-MNIST (`cnn` by default), requeued when preempted or near its limit.
#   sbatch jobs/sbatch_fashion.sh                                  (2 nodes x 4 ranks)
#   sbatch -N 4 --ntasks-per-node=4 jobs/sbatch_fashion.sh --set train.epochs=20
#   sbatch --gpus-per-node=4 jobs/sbatch_fashion.sh                (GPU sites: one rank per GPU)
# Site settings are the #SBATCH lines (partition, account, GPUs, CPUs per task) and the
# environment: BIN (ringtrain binary), CONFIG (TOML), CKPT_DIR (default runs/fashion-<job id>),
# LAUNCHER=mpirun (default: Open MPI's mpirun reads the allocation) or srun (srun --mpi=pmix).
#
# Time limits and preemption: Slurm sends SIGUSR1 to this batch shell 120 s before the limit
# (--signal=B:USR1@120, up to 60 s earlier); the trap forwards it to the training step, which
# writes a checkpoint at the exact position and exits 75 (EX_TEMPFAIL); the script then
# requeues the job, and the restarted job (same id, SLURM_RESTART_COUNT+1) resumes from the
# newest checkpoint in CKPT_DIR with `--resume auto`.
#SBATCH --job-name=ringtrain-fashion
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=00:30:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=runs/slurm-%j.out
set -uo pipefail

say() { echo "[sbatch_fashion $(date -u +%H:%M:%S)] $*"; }
fail() { echo "sbatch_fashion: error: $*" >&2; exit 2; }

if [ -z "${SLURM_JOB_ID:-}" ]; then
    fail "not inside a Slurm job (SLURM_JOB_ID is unset). Submit it: sbatch jobs/sbatch_fashion.sh [ringtrain args]; on one machine use jobs/mpirun_fashion.sh"
fi
cd "${SLURM_SUBMIT_DIR:?}" || fail "cannot enter the submit directory '$SLURM_SUBMIT_DIR'"
# Each rank computes with the CPUs Slurm gives its task. The key decides (a job configuration's
# own train.threads would override OMP_NUM_THREADS); it comes before "$@", so --set train.threads=N wins.
THREADS=${SLURM_CPUS_PER_TASK:-1}
BIN=${BIN:-build/ringtrain}
CONFIG=${CONFIG:-jobs/fashion_cnn.toml}
CKPT_DIR=${CKPT_DIR:-runs/fashion-$SLURM_JOB_ID}
LAUNCHER=${LAUNCHER:-mpirun}
RANKS=${SLURM_NTASKS:-$(( ${SLURM_JOB_NUM_NODES:-1} * ${SLURM_NTASKS_PER_NODE:-1} ))}
[ -x "$BIN" ] || fail "ringtrain binary '$BIN' not found or not executable (set BIN=...)"
[ -f "$CONFIG" ] || fail "configuration '$CONFIG' not found (set CONFIG=...)"

# The layout must run at this rank count: the trainer's own plan says so (`--print-plan`, one
# process, the same configuration and flags as the step), or why not, before any rank starts.
out=$("$BIN" train --config "$CONFIG" "$@" --print-config 2>&1) || fail "the configuration is refused: ${out#error: }"
out=$("$BIN" train --config "$CONFIG" "$@" --print-plan --ranks "$RANKS" 2>&1) ||
    fail "the job has $RANKS ranks, and the configuration cannot run there: ${out#error: } (choose --nodes/--ntasks-per-node, or the layout)"

# Checkpoints must be writable before the step starts: a signal near the time limit
# would otherwise find nowhere to save and the allocation would be lost.
mkdir -p "$CKPT_DIR" 2>/dev/null || fail "cannot create checkpoint directory '$CKPT_DIR'"
probe="$CKPT_DIR/.write-probe-$SLURM_JOB_ID"
{ : > "$probe"; } 2>/dev/null && rm -f "$probe" || fail "checkpoint directory '$CKPT_DIR' is not writable"

[ -f data/fashion-mnist/fashion-mnist-train.h5 ] || "$BIN" prepare --dataset fashion-mnist --out data/fashion-mnist ||
    fail "could not prepare data/fashion-mnist"

# `--resume auto`: resume from CKPT_DIR when it holds this run's checkpoint, else start fresh.
resume=(--resume auto)
if ! "$BIN" train --help 2>/dev/null | grep -q -- '--resume.*auto'; then
    say "warning: $BIN has no '--resume auto'; a requeued run restarts from the beginning"
    resume=()
fi
train=("$BIN" train --config "$CONFIG" --set checkpoint.dir="$CKPT_DIR" --set log.format=plain --set train.threads="$THREADS"
       "${resume[@]}" "$@")
case $LAUNCHER in
    # Each rank bound to its own THREADS cores (Open MPI binds a rank to one core by default).
    mpirun) step=(mpirun -np "$RANKS")
            [ "$THREADS" -gt 1 ] && step+=(--map-by "slot:PE=$THREADS")
            step+=("${train[@]}") ;;
    # srun takes no CPUs per task from the allocation (Slurm 22.05 on): say it.
    srun) step=(srun --mpi=pmix --kill-on-bad-exit=1 --cpus-per-task="$THREADS" "${train[@]}") ;;
    *) fail "LAUNCHER must be mpirun or srun, not '$LAUNCHER'" ;;
esac

say "job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0}: $RANKS ranks on ${SLURM_JOB_NUM_NODES:-?} node(s) (${SLURM_JOB_NODELIST:-?}) via $LAUNCHER, checkpoints in $CKPT_DIR"
# bash runs a trap only between foreground commands: start the step in the background and wait.
signalled=
forward() { signalled=$1; say "got SIG$1: asking the training step to checkpoint and stop"; kill -"$1" "$pid" 2>/dev/null; }
trap 'forward USR1' USR1
trap 'forward TERM' TERM
"${step[@]}" &
pid=$!
while :; do
    wait "$pid"; rc=$?
    # A status above 128 with the step still alive means a trap interrupted `wait`.
    if [ $rc -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    break
done
trap - USR1 TERM

case $rc in
    0) say "training finished (metrics: $CKPT_DIR/metrics.jsonl)"; exit 0 ;;
    75)
        say "training stopped with a checkpoint (exit 75${signalled:+ after SIG$signalled}); requeueing job $SLURM_JOB_ID: it restarts and resumes from $CKPT_DIR"
        # On success Slurm ends this shell at once and queues the job again (same id).
        scontrol requeue "$SLURM_JOB_ID" && exit 0
        say "scontrol requeue failed: resubmit with the same CKPT_DIR=$CKPT_DIR to resume"; exit 75 ;;
    2) say "training rejected its input (exit 2): see the messages above; not requeued"; exit 2 ;;
    *) say "training failed (exit $rc); not requeued; checkpoints written so far stay in $CKPT_DIR"; exit "$rc" ;;
esac
