# Helpers for the Slurm tests (sourced inside `cluster.sh run`, which set SLURM_CONF).
# Needs: SRC (source dir), BIN (ringtrain), WORK (a scratch directory of the test).

check() {  # check DESCRIPTION CMD...: one assertion; a failure prints the logs and ends the test
    local what=$1; shift
    if "$@"; then echo "PASS: $what"; else echo "FAIL: $what  [$*]" >&2; dump_logs; exit 1; fi
}

dump_logs() {
    echo "---- job output files" >&2; tail -n 40 "$WORK"/*.out >&2 2>/dev/null
    echo "---- slurm logs" >&2; tail -n 15 "${RT_SLURM_DIR:-/nonexistent}"/log/*.log >&2 2>/dev/null
}

job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }

wait_job() {  # wait_job ID SECONDS: until the job has ended for good; prints its final state
    local id=$1 t=$2 end=$((SECONDS + $2)) s
    while [ $SECONDS -lt $end ]; do
        s=$(job_state "$id")
        case $s in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) echo "$s"; return 0 ;; esac
        sleep 1
    done
    echo "TIMEOUT_WAITING($(job_state "$id"))"; return 1
}

wait_running() {  # wait_running ID SECONDS
    local end=$((SECONDS + $2))
    while [ $SECONDS -lt $end ]; do [ "$(job_state "$1")" = RUNNING ] && return 0; sleep 0.5; done
    return 1
}

submit() {  # submit SBATCH-ARGS... -- SCRIPT-ARGS...: prints the job id
    local out
    out=$(cd "$SRC" && sbatch --parsable "$@") || return 1
    echo "${out%%;*}"
}

# Compares every tensor of two checkpoints bit for bit (one file, or a parallel
# checkpoint's manifest and parts; an independent reader of the format).
same_tensors() {
    /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/../support/checkpoint_tensors.py" "$1" "$2"
}

# The newest checkpoint (a file, or a parallel checkpoint's manifest: not its parts).
newest_ckpt() { ls -t "$1"/*.h5 2>/dev/null | grep -v '\.part-' | head -1; }
