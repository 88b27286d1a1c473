#!/bin/bash
# Runs an MPI program across emulated hosts (network namespaces) on this machine.
#   tests/hosts/run_mpi.sh [--rate RATE] [--keep] RANKS_PER_HOST -- PROGRAM ARGS...
# RANKS_PER_HOST: comma list, e.g. 2,2 (2 hosts x 2 ranks) or 2,1,2 (uneven).
# Creates the hosts, runs mpirun over TCP between them (shared memory inside each), removes
# everything afterwards, also on failure or a signal. Exit status: the program's; 77 when
# namespaces cannot be created here (the reason is printed).
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/netns.sh"
rate=""
while [ $# -gt 0 ]; do
    case $1 in
        --rate) rate=$2; shift 2 ;;
        *) break ;;
    esac
done
spec=${1:?usage: run_mpi.sh [--rate R] RANKS_PER_HOST -- PROGRAM ARGS...}; shift
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "run_mpi.sh: no program" >&2; exit 2; }

if ! why=$(netns_supported); then echo "SKIPPED: $why"; exit 77; fi

# Unique per invocation, so parallel tests and other users of netns.sh never collide.
prefix="rth$(( $$ % 100000 ))"
subnet="10.$(( 100 + $$ % 100 )).$(( ($$ / 100) % 250 ))"
mpirun_pid=""
cleanup() {
    [ -n "$mpirun_pid" ] && kill "$mpirun_pid" 2>/dev/null && wait "$mpirun_pid" 2>/dev/null
    netns_destroy "$prefix"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

IFS=, read -r -a counts <<< "$spec"
netns_create "$prefix" "${#counts[@]}" "$subnet" "$rate" || { echo "run_mpi.sh: netns_create failed" >&2; exit 1; }
hosts=""; np=0
for i in "${!counts[@]}"; do
    hosts="${hosts:+$hosts,}$prefix$((i + 1)):${counts[$i]}"
    np=$((np + counts[i]))
done
mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" --host "$hosts" \
    --mca plm_rsh_agent "$here/rsh_agent.sh" \
    --mca btl tcp,self,vader --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
    --mca btl_vader_single_copy_mechanism none \
    -x OMP_NUM_THREADS=1 -x RT_HOSTS_PREFIX="$prefix" -x RT_HOSTS="$spec" ${RINGTRAIN_SOURCE_DIR:+-x RINGTRAIN_SOURCE_DIR} \
    "$@" &
# In the background: bash runs a signal's trap only once the foreground command ends.
mpirun_pid=$!
wait "$mpirun_pid"
rc=$?
mpirun_pid=""
exit "$rc"
