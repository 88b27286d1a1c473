#!/bin/sh
# Launch agent for mpirun (--mca plm_rsh_agent): runs the command inside the network namespace
# named like the host (and with that host name), as ssh would run it on that host. Open MPI may pass ssh-style options first.
while [ $# -gt 0 ]; do
    case $1 in -*) shift ;; *) break ;; esac
done
host=$1; shift
[ -e "/run/netns/$host" ] || { echo "rsh_agent: no emulated host '$host'" >&2; exit 255; }
# Its own UTS namespace too: the host name is the emulated host's, so node-local names that
# embed it (Open MPI's vader segments in /dev/shm) differ between emulated hosts.
export RT_EMULATED_HOST="$host"
exec nsenter --net="/run/netns/$host" unshare --uts sh -c 'hostname "$RT_EMULATED_HOST" && exec sh -c "$0"' "$*"
