#!/usr/bin/env bash
# CTest jobs/signal_resume_mpirun: without Slurm. SIGUSR1 to mpirun mid-epoch -> the ranks write a
# checkpoint and exit 75; `--resume auto` by hand finishes the run, and every tensor of the final
# checkpoint equals an uninterrupted 2-rank run's bit for bit.
# Usage: signal_resume_mpirun.sh SRC_DIR RINGTRAIN_BIN
set -uo pipefail
SRC=$1; BIN=$2
. "$(dirname "$0")/lib.sh"
WORK=$(mktemp -d /tmp/rt-sigresume.XXXXXX); trap 'rm -rf "$WORK"' EXIT
dump_logs() { tail -n 30 "$WORK"/*.log >&2 2>/dev/null; }
# The option is part of the trainer: its absence is a regression (FAIL), never a reason to skip.
check "ringtrain train --help documents --resume auto" \
    bash -c '"$1" train --help 2>&1 | grep -q -- "--resume.*auto"' _ "$BIN"
[ -f "$SRC/data/fashion-mnist/fashion-mnist-train.h5" ] ||
    "$BIN" prepare --dataset fashion-mnist --out "$SRC/data/fashion-mnist" >/dev/null || exit 1
cd "$SRC" || exit 1
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1)
train=("$BIN" train --config jobs/fashion_cnn.toml --set log.format=plain --set train.max_steps=80
       --set train.epochs=1 --set log.interval=5 --no-eval)
run() { local dir=$1; shift; "${mpi[@]}" "${train[@]}" --set checkpoint.dir="$dir" "$@"; }
run "$WORK/ref" > "$WORK/ref.log" 2>&1
check "uninterrupted run finished" test $? = 0
# mpirun itself in the background (not a subshell), so the signal reaches it.
"${mpi[@]}" "${train[@]}" --set checkpoint.dir="$WORK/run" --resume auto > "$WORK/run1.log" 2>&1 &
pid=$!
end=$((SECONDS + 180))
until grep -qE '^epoch 1/1 step (1[0-9]|[2-9][0-9])/' "$WORK/run1.log" || [ $SECONDS -ge $end ]; do sleep 0.2; done
kill -USR1 "$pid"
wait "$pid"; rc=$?
check "signalled run exited 75 (got $rc)" test "$rc" = 75
check "a checkpoint was written" test -n "$(newest_ckpt "$WORK/run")"
run "$WORK/run" --resume auto > "$WORK/run2.log" 2>&1
check "resumed run finished" test $? = 0
check "final checkpoints bitwise equal" same_tensors "$(newest_ckpt "$WORK/ref")" "$(newest_ckpt "$WORK/run")"
echo "1 passed, 0 failed"
