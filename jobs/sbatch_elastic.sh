#!/usr/bin/env bash
# Slurm job that survives the loss of nodes: data-parallel training (`cnn` on Fashion-MNIST by
# default) that, when a node dies, continues on the nodes still alive from the last checkpoint.
#   sbatch -N 3 jobs/sbatch_elastic.sh --set train.epochs=20
#   MAX_RELAUNCHES=5 MIN_NODES=2 sbatch -N 4 --ntasks-per-node=4 jobs/sbatch_elastic.sh
# Environment: BIN, CONFIG, CKPT_DIR, LAUNCHER (mpirun | srun) as in jobs/sbatch_fashion.sh, and
#   MAX_RELAUNCHES (default 3)  relaunches after failed steps before giving up
#   MIN_NODES (default 1)       fewer nodes alive than this ends the job
#   PROBE_S (default 20)        seconds a node has to run `true` to count as alive
#   KILL_GRACE_S (default 0)    seconds mpirun gives the other ranks between SIGTERM and SIGKILL
#                               when one fails (Open MPI's odls_base_sigkill_timeout, 1 s by
#                               default): ranks blocked on a dead peer cannot use them, and every
#                               checkpoint is durable before a rank exits (docs/checkpoints.md)
#
# How: the allocation is kept when a node fails (--no-kill). Each step trains with
# `--resume auto` and a fixed data.global_batch (from the configuration, else the first launch's, as
# `ringtrain train --print-plan` resolves it), so a checkpoint of this run continues at any layout
# with the same data order and schedule (README: elastic training). When a step fails, every node
# of the allocation is probed with a one-task srun; the step is relaunched on the nodes that
# answer, at the largest rank count whose plan (`--print-plan --ranks N`: the trainer's own layout
# and batch-split rules) exists, from the newest checkpoint. Each relaunch reports the steps lost (trained after the last
# checkpoint, trained again): set checkpoint.every_steps to bound them.
#SBATCH --job-name=ringtrain-elastic
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time=01:00:00
#SBATCH --no-kill
#SBATCH --open-mode=append
#SBATCH --output=runs/slurm-%j.out
set -uo pipefail

say() { echo "[sbatch_elastic $(date -u +%H:%M:%S)] $*"; }
fail() { echo "sbatch_elastic: error: $*" >&2; exit 2; }

[ -n "${SLURM_JOB_ID:-}" ] || fail "not inside a Slurm job (SLURM_JOB_ID is unset). Submit it: sbatch -N 3 jobs/sbatch_elastic.sh [ringtrain args]"
cd "${SLURM_SUBMIT_DIR:?}" || fail "cannot enter the submit directory '$SLURM_SUBMIT_DIR'"
# Each rank computes with the CPUs Slurm gives its task; the key decides, before "$@" (sbatch_fashion.sh).
THREADS=${SLURM_CPUS_PER_TASK:-1}
BIN=${BIN:-build/ringtrain}
CONFIG=${CONFIG:-jobs/fashion_cnn.toml}
CKPT_DIR=${CKPT_DIR:-runs/elastic-$SLURM_JOB_ID}
LAUNCHER=${LAUNCHER:-mpirun}
MAX_RELAUNCHES=${MAX_RELAUNCHES:-3}
MIN_NODES=${MIN_NODES:-1}
PROBE_S=${PROBE_S:-20}
KILL_GRACE_S=${KILL_GRACE_S:-0}
TPN=${SLURM_NTASKS_PER_NODE:-1}; TPN=${TPN%%(*}
[ -x "$BIN" ] || fail "ringtrain binary '$BIN' not found or not executable (set BIN=...)"
[ -f "$CONFIG" ] || fail "configuration '$CONFIG' not found (set CONFIG=...)"
for v in MAX_RELAUNCHES MIN_NODES PROBE_S KILL_GRACE_S TPN; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || fail "$v must be a non-negative integer, not '${!v}'"
done
case $LAUNCHER in mpirun|srun) ;; *) fail "LAUNCHER must be mpirun or srun, not '$LAUNCHER'" ;; esac

# The trainer's own plan of a layout (`ringtrain train --print-plan`, one process, no mpirun): the
# same configuration, flags and rules as the job's steps, so the script repeats none of them.
# plan RANKS [ARGS...]: the plan's JSON on stdout; exit 2 with the trainer's message when the
# configuration cannot run at RANKS ranks.
plan() {
    local r=$1; shift
    "$BIN" train --config "$CONFIG" "$@" --print-plan --ranks "$r"
}
# json_int KEY: that integer field of the plan on stdin.
json_int() { sed -n "s/^ *\"$1\": *\([0-9][0-9]*\).*/\1/p" | head -1; }
nodes=($(scontrol show hostnames "${SLURM_JOB_NODELIST:?}"))
# The global batch every launch keeps: data.global_batch as the trainer reads it (the effective
# configuration it prints), else what the first launch's plan makes of data.batch_size.
cfg=$("$BIN" train --config "$CONFIG" "$@" --print-config 2>&1) || fail "the configuration is refused: ${cfg#error: }"
G=$(sed -n 's/^global_batch = \([0-9][0-9]*\)$/\1/p' <<< "$cfg")
[[ "$G" =~ ^[0-9]+$ ]] || fail "no data.global_batch in the effective configuration: $cfg"
if [ "$G" -eq 0 ]; then
    r=$(( ${#nodes[@]} * TPN ))
    first=$(plan "$r" "$@" 2>&1) || fail "the configuration cannot run on the job's $r ranks: ${first#error: }"
    G=$(json_int global_batch <<< "$first")
fi
# fits RANKS: true when the configuration with data.global_batch=G runs at RANKS ranks; the
# plan (or, when none, the trainer's reason) is left in $fit.
fits() { local r=$1; shift; fit=$(plan "$r" "$@" --set data.global_batch="$G" 2>&1); }

alive_nodes() {  # the allocation's nodes that run a one-task step within PROBE_S seconds
    local n
    for n in "${nodes[@]}"; do
        timeout "$PROBE_S" srun --overlap --nodes=1 --ntasks=1 --nodelist="$n" --time=1 true >/dev/null 2>&1 && echo "$n"
    done
}

mkdir -p "$CKPT_DIR" 2>/dev/null || fail "cannot create checkpoint directory '$CKPT_DIR'"
probe="$CKPT_DIR/.write-probe-$SLURM_JOB_ID"
{ : > "$probe"; } 2>/dev/null && rm -f "$probe" || fail "checkpoint directory '$CKPT_DIR' is not writable"
[ -f data/fashion-mnist/fashion-mnist-train.h5 ] || "$BIN" prepare --dataset fashion-mnist --out data/fashion-mnist ||
    fail "could not prepare data/fashion-mnist"

# last_step LOG: the last global step the log reports trained ("epoch E/N step s/S" lines).
last_step() { awk '/^epoch [0-9]+\/[0-9]+ step [0-9]+\/[0-9]+ /{split($2,e,"/"); split($4,s,"/"); g=(e[1]-1)*s[2]+s[1]} END{print g+0}' "$1"; }
# resumed_at LOG: the global step of the checkpoint the step loaded ("" when it started fresh).
resumed_at() { sed -n 's/.*loaded checkpoint .*global step \([0-9]*\)).*/\1/p' "$1" | tail -1; }

# A step that lost a node never completes in slurmctld's eyes (until the node is marked down) and
# keeps its CPUs: later steps share them (srun --overlap; SLURM_OVERLAP reaches mpirun's srun too).
export SLURM_OVERLAP=1
use=("${nodes[@]}")
launches=0 lost_total=0 prev_log=
say "job $SLURM_JOB_ID: ${#nodes[@]} node(s) (${nodes[*]}), $TPN rank(s) per node, global batch $G, checkpoints in $CKPT_DIR; up to $MAX_RELAUNCHES relaunch(es), at least $MIN_NODES node(s)"
while :; do
    # The largest rank count on the nodes in `use` at which the trainer accepts the layout and
    # splits the global batch exactly (its plan says so, or why not).
    k=${#use[@]} why=
    while [ "$k" -ge "$MIN_NODES" ] && [ "$k" -gt 0 ]; do
        fits $((k * TPN)) "$@" && break
        why=${why:-"at $((k * TPN)) rank(s): $fit"}
        k=$((k - 1))
    done
    if [ "$k" -lt "$MIN_NODES" ] || [ "$k" -eq 0 ]; then
        say "stopping: ${#use[@]} node(s) alive, and no layout on at least MIN_NODES=$MIN_NODES of them keeps data.global_batch=$G ($TPN rank(s) per node; ${why:-no node left}); checkpoints stay in $CKPT_DIR"
        exit 3
    fi
    run=("${use[@]:0:k}"); ranks=$((k * TPN))
    log=$CKPT_DIR/step-$launches.log
    train=("$BIN" train --config "$CONFIG" --set checkpoint.dir="$CKPT_DIR" --set log.format=plain
           --set train.threads="$THREADS" --resume auto "$@" --set data.global_batch="$G")
    hosts=$(printf "%s:$TPN," "${run[@]}")
    case $LAUNCHER in
        mpirun) step=(mpirun --mca odls_base_sigkill_timeout "$KILL_GRACE_S" -np "$ranks" --host "${hosts%,}")
                [ "$THREADS" -gt 1 ] && step+=(--map-by "slot:PE=$THREADS")
                step+=("${train[@]}") ;;
        srun) step=(srun --mpi=pmix --kill-on-bad-exit=1 --nodes="$k" --ntasks="$ranks" --cpus-per-task="$THREADS"
                    --nodelist="$(IFS=,; echo "${run[*]}")" "${train[@]}") ;;
    esac
    say "launch $launches: $ranks rank(s) on $k node(s) (${run[*]}) via $LAUNCHER: data $(json_int data <<< "$fit") x pipeline $(json_int pipeline <<< "$fit") x tensor $(json_int tensor <<< "$fit"), $(json_int batch_per_rank <<< "$fit") sample(s) per rank x $(json_int accumulation <<< "$fit") accumulation"
    # Output to the job's file and to a log of this launch (the lost-work accounting reads it).
    # (A group, so that this shell makes the process substitution and $! is tee's pid.)
    { "${step[@]}"; } > >(tee "$log") 2>&1
    rc=$?
    wait $!  # tee's last lines
    if [ -n "$prev_log" ]; then
        at=$(resumed_at "$log"); reached=$(last_step "$prev_log")
        if [ -n "$at" ]; then
            lost=$((reached > at ? reached - at : 0)); lost_total=$((lost_total + lost))
            say "launch $launches resumed at step $at; the failed launch had reached step $reached: $lost step(s) lost and trained again"
        else
            say "launch $launches found no checkpoint of this run: it started from step 0 (the failed launch had reached step $reached)"
        fi
    fi
    case $rc in
        0) say "training finished after $launches relaunch(es), $lost_total step(s) lost in all (metrics: $CKPT_DIR/metrics.jsonl)"; exit 0 ;;
        2) say "training rejected its input (exit 2): see the messages above; not relaunched"; exit 2 ;;
    esac
    if [ "$launches" -ge "$MAX_RELAUNCHES" ]; then
        say "stopping: the step failed (exit $rc) and MAX_RELAUNCHES=$MAX_RELAUNCHES relaunch(es) are used up; checkpoints stay in $CKPT_DIR"
        exit "$rc"
    fi
    use=($(alive_nodes))
    gone=$(comm -23 <(printf '%s\n' "${nodes[@]}" | sort) <(printf '%s\n' "${use[@]}" | sort) | tr '\n' ' ')
    say "step failed (exit $rc); nodes alive: ${use[*]:-none}${gone:+; lost: $gone}"
    nodes=("${use[@]}") prev_log=$log launches=$((launches + 1))
done
