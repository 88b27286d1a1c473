#!/usr/bin/env bash
# CTest slurm/bad_input: jobs/sbatch_fashion.sh refuses bad input with a clear message and
# exit status 2, before starting any rank (a layout that cannot run: the trainer's own plan says why). No cluster needed (the Slurm variables are set by hand).
# Usage: bad_input.sh SRC_DIR RINGTRAIN_BIN
set -uo pipefail
SRC=$1; BIN=$2
WORK=$(mktemp -d /tmp/rt-slurm-bad.XXXXXX)
cleanup() { umount "$WORK/ro" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
JOB=$SRC/jobs/sbatch_fashion.sh
fails=0
expect() {  # expect DESCRIPTION RC PATTERN CMD...: CMD exits RC and says PATTERN on stderr
    local what=$1 want=$2 pat=$3 rc; shift 3
    "$@" > "$WORK/stdout" 2> "$WORK/stderr"; rc=$?
    if [ "$rc" = "$want" ] && grep -qE "$pat" "$WORK/stderr" && ! pgrep -f "$WORK/ckpt" >/dev/null; then
        echo "PASS: $what: $(head -1 "$WORK/stderr")"
    else
        echo "FAIL: $what: exit $rc (want $want), stderr:"; cat "$WORK/stderr" "$WORK/stdout"; fails=$((fails + 1))
    fi
}
slurm_env=(env SLURM_JOB_ID=4242 SLURM_SUBMIT_DIR="$SRC" SLURM_JOB_NUM_NODES=2 BIN="$BIN" CKPT_DIR="$WORK/ckpt")

expect "run outside Slurm" 2 'not inside a Slurm job \(SLURM_JOB_ID is unset\).*sbatch' \
    env -u SLURM_JOB_ID "$JOB"
expect "3 ranks, pipeline 2" 2 'has 3 ranks, and the configuration cannot run there: parallel.pipeline = 2 x parallel.tensor = 1 does not divide the 3 ranks' \
    "${slurm_env[@]}" SLURM_NTASKS=3 "$JOB" --set parallel.pipeline=2
expect "4 ranks, pipeline 2 x tensor 4 (--set=)" 2 'cannot run there: parallel.pipeline = 2 x parallel.tensor = 4 does not divide the 4 ranks' \
    "${slurm_env[@]}" SLURM_NTASKS=4 "$JOB" --set=parallel.pipeline=2 --set parallel.tensor=4
printf '[data]\nbatch_size = 48\n[parallel]\npipeline = 3\n' > "$WORK/grid.toml"
expect "pipeline 3 in the config file, 4 ranks" 2 'cannot run there: parallel.pipeline = 3 x parallel.tensor = 1 does not divide the 4 ranks' \
    "${slurm_env[@]}" SLURM_NTASKS=4 CONFIG="$WORK/grid.toml" "$JOB"
# The trainer reads the file, so a float where an integer belongs is refused, not mangled
# (awk made 1e3 into 13), and a global batch without an exact split at 4 ranks is named.
printf '[data]\nglobal_batch = 1e3\n' > "$WORK/float.toml"
expect "global_batch = 1e3 in the config file" 2 "the configuration is refused: .*key 'data.global_batch' must be an integer" \
    "${slurm_env[@]}" SLURM_NTASKS=4 CONFIG="$WORK/float.toml" "$JOB"
expect "global batch 1001 at 4 ranks" 2 'data.global_batch = 1001 has no exact split' \
    "${slurm_env[@]}" SLURM_NTASKS=4 "$JOB" --set data.global_batch=1001
expect "missing binary" 2 "ringtrain binary '/nonexistent/ringtrain' not found" \
    "${slurm_env[@]}" SLURM_NTASKS=2 BIN=/nonexistent/ringtrain "$JOB"
expect "unknown launcher" 2 "LAUNCHER must be mpirun or srun, not 'ssh'" \
    "${slurm_env[@]}" SLURM_NTASKS=2 LAUNCHER=ssh "$JOB" --set train.max_steps=1
: > "$WORK/afile"
expect "checkpoint dir under a file" 2 "cannot create checkpoint directory '$WORK/afile/ckpt'" \
    "${slurm_env[@]}" SLURM_NTASKS=2 CKPT_DIR="$WORK/afile/ckpt" "$JOB"
# jobs/sbatch_elastic.sh: the same refusals, and its own settings.
EJOB=$SRC/jobs/sbatch_elastic.sh
expect "elastic: run outside Slurm" 2 'not inside a Slurm job \(SLURM_JOB_ID is unset\).*sbatch -N 3' \
    env -u SLURM_JOB_ID "$EJOB"
expect "elastic: MAX_RELAUNCHES not a number" 2 "MAX_RELAUNCHES must be a non-negative integer, not 'many'" \
    "${slurm_env[@]}" MAX_RELAUNCHES=many "$EJOB"
expect "elastic: unknown launcher" 2 "LAUNCHER must be mpirun or srun, not 'ssh'" \
    "${slurm_env[@]}" LAUNCHER=ssh "$EJOB"
# Root writes through file modes, so a read-only mount makes the directory unwritable.
mkdir -p "$WORK/ro"
if mount --bind "$WORK/ro" "$WORK/ro" 2>/dev/null && mount -o remount,bind,ro "$WORK/ro" 2>/dev/null; then
    expect "read-only checkpoint dir" 2 "checkpoint directory '$WORK/ro' is not writable" \
        "${slurm_env[@]}" SLURM_NTASKS=2 CKPT_DIR="$WORK/ro" "$JOB"
else
    umount "$WORK/ro" 2>/dev/null
    skipped="read-only checkpoint dir: 'mount --bind' is refused here (needs root with CAP_SYS_ADMIN)"
fi
if [ $fails != 0 ]; then echo "0 passed, 1 failed"; exit 1; fi
# A case that could not run makes the test skipped (77, SKIP_RETURN_CODE), not passed.
if [ -n "${skipped:-}" ]; then echo "SKIP: $skipped; the other cases passed"; exit 77; fi
echo "1 passed, 0 failed"
