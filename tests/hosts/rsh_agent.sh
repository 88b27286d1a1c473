#!/bin/sh
# Launch agent for mpirun (--mca plm_rsh_agent): runs the command inside the network namespace
# named like the host, as ssh would run it on that host. Open MPI may pass ssh-style options first.
while [ $# -gt 0 ]; do
    case $1 in -*) shift ;; *) break ;; esac
done
host=$1; shift
[ -e "/run/netns/$host" ] || { echo "rsh_agent: no emulated host '$host'" >&2; exit 255; }
exec nsenter --net="/run/netns/$host" sh -c "$*"
