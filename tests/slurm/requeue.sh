#!/usr/bin/env bash
# CTest slurm/requeue: a 2-node job signalled mid-epoch (SIGUSR1 to the batch shell, as
# --signal=B:USR1@120 does before the time limit) checkpoints, exits 75, requeues itself, resumes
# with --resume auto and ends with every tensor (parameters, buffers, optimizer state) bitwise equal
# to an uninterrupted job of the same layout. Then: a signal that finds the checkpoint directory
# read-only does not requeue and leaves the earlier checkpoints intact.
# Usage: requeue.sh SRC_DIR RINGTRAIN_BIN   (inside tests/slurm/cluster.sh run 2 -- ...)
set -uo pipefail
SRC=$1; BIN=$2
. "$(dirname "$0")/lib.sh"
WORK=$(mktemp -d /tmp/rt-slurm-requeue.XXXXXX)
trap 'umount "$WORK/ro" 2>/dev/null; rm -rf "$WORK"' EXIT
# The option is part of the trainer: its absence is a regression (FAIL), never a reason to skip.
check "ringtrain train --help documents --resume auto" \
    bash -c '"$1" train --help 2>&1 | grep -q -- "--resume.*auto"' _ "$BIN"
[ -f "$SRC/data/fashion-mnist/fashion-mnist-train.h5" ] ||
    "$BIN" prepare --dataset fashion-mnist --out "$SRC/data/fashion-mnist" >/dev/null || exit 1
export BIN
STEPS=80
sb=(-N 2 --ntasks-per-node=1 --cpus-per-task=1 --time=00:10:00)
args=(--set train.max_steps=$STEPS --set train.epochs=1 --set log.interval=5 --no-eval)

# Uninterrupted reference.
ref=$(CKPT_DIR=$WORK/ref submit "${sb[@]}" --output="$WORK/ref-%j.out" jobs/sbatch_fashion.sh "${args[@]}")
check "reference job $ref completed" test "$(wait_job "$ref" 300)" = COMPLETED

# Signalled job: USR1 to the batch shell once it has trained some steps.
id=$(CKPT_DIR=$WORK/run submit "${sb[@]}" --output="$WORK/run-%j.out" jobs/sbatch_fashion.sh "${args[@]}")
out=$WORK/run-$id.out
end=$((SECONDS + 180))
until grep -qE '^epoch 1/1 step (1[0-9]|[2-9][0-9])/' "$out" 2>/dev/null || [ $SECONDS -ge $end ]; do sleep 0.2; done
check "job $id is training" grep -qE '^epoch 1/1 step' "$out"
scancel --signal=USR1 --batch "$id"
state=$(wait_job "$id" 300)
check "requeued job $id completed (state $state)" test "$state" = COMPLETED
check "batch shell forwarded SIGUSR1" grep -q 'got SIGUSR1' "$out"
check "trainer stopped with exit 75" grep -q 'training stopped with a checkpoint (exit 75' "$out"
check "job requeued itself" grep -q "requeueing job $id: it restarts" "$out"
check "Slurm counted one restart" test "$(job_field "$id" Restarts)" = 1
check "second run started with SLURM_RESTART_COUNT=1" grep -q "job $id restart 1:" "$out"
check "second run finished" grep -q 'training finished' "$out"
at=$(grep -oE 'loaded checkpoint .*epoch 1 step [0-9]+ of' "$out" | grep -oE 'step [0-9]+' | awk '{print $2}')
check "the restart resumed mid-epoch (step ${at:-none} of $STEPS)" test "${at:-0}" -gt 0 -a "${at:-0}" -lt "$STEPS"
check "final checkpoints bitwise equal to the uninterrupted job's" \
    same_tensors "$(newest_ckpt "$WORK/ref")" "$(newest_ckpt "$WORK/run")"

# A signal when the checkpoint directory has become read-only: no requeue, earlier files kept.
mkdir -p "$WORK/ro"
if mount --bind "$WORK/ro" "$WORK/ro" 2>/dev/null && mount -o remount,bind,ro "$WORK/ro" 2>/dev/null; then
    umount "$WORK/ro"
    # A short job leaves a checkpoint; the next one (max_steps raised) gets the signal after the
    # directory has turned read-only.
    ro_args=(--set train.epochs=1 --set log.interval=5 --no-eval --set log.metrics="$WORK/ro-metrics.jsonl")
    id=$(CKPT_DIR=$WORK/ro submit "${sb[@]}" --output="$WORK/ro-%j.out" jobs/sbatch_fashion.sh "${ro_args[@]}" \
         --set train.max_steps=10)
    check "job $id left a checkpoint" test "$(wait_job "$id" 300)" = COMPLETED -a -n "$(newest_ckpt "$WORK/ro")"
    id=$(CKPT_DIR=$WORK/ro submit "${sb[@]}" --output="$WORK/ro-%j.out" jobs/sbatch_fashion.sh "${ro_args[@]}" \
         --set train.max_steps=100000)
    out=$WORK/ro-$id.out
    end=$((SECONDS + 240))
    until grep -qE '^epoch 1/1 step ([2-9][0-9]|[1-9][0-9][0-9])/' "$out" 2>/dev/null || [ $SECONDS -ge $end ]; do sleep 0.2; done
    check "job $id is training" grep -qE '^epoch 1/1 step' "$out"
    before=$(cd "$WORK/ro" && ls -l --time-style=+%s.%N; md5sum ./*)
    mount --bind "$WORK/ro" "$WORK/ro" && mount -o remount,bind,ro "$WORK/ro"
    scancel --signal=USR1 --batch "$id"
    state=$(wait_job "$id" 300)
    umount "$WORK/ro"
    check "job with a read-only checkpoint dir ended without requeue (state $state)" test "$state" = FAILED
    check "no requeue after a failed checkpoint" test "$(job_field "$id" Restarts)" = 0
    check "the script says why" grep -q 'not requeued; checkpoints written so far stay' "$out"
    check "files in the checkpoint dir unchanged" test "$(cd "$WORK/ro" && ls -l --time-style=+%s.%N; md5sum ./*)" = "$before"
else
    # Every check above passed (a failure exits 1), but one case could not run: ctest reports
    # the test skipped (SKIP_RETURN_CODE 77), not passed.
    umount "$WORK/ro" 2>/dev/null
    echo "SKIP: read-only checkpoint directory case not run: 'mount --bind' is refused here" \
         "(needs root with CAP_SYS_ADMIN); the requeue checks above passed"
    exit 77
fi
echo "1 passed, 0 failed"
