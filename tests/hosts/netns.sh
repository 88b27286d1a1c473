# Emulated hosts in network namespaces: a library to source, not a script to run.
#
#   . tests/hosts/netns.sh
#   netns_create PREFIX N SUBNET [RATE]   # hosts PREFIX1..PREFIXN on bridge PREFIXbr
#   netns_hosts PREFIX                    # their names, one a line
#   netns_addr PREFIX I                   # address of host I (1-based)
#   netns_exec HOST CMD...                # run CMD inside HOST's network namespace
#   netns_destroy PREFIX                  # remove every namespace, link and bridge of PREFIX
#
# PREFIX: letters/digits, at most 8 characters (interface names are limited to 15), and it
#   must differ from this machine's hostname (Open MPI would treat the host as local).
# SUBNET: the first three octets of a private /24, e.g. 10.77.3. Host I gets SUBNET.(I+1);
#   the bridge in the root namespace gets SUBNET.254, so daemons there (mpirun, slurmctld)
#   reach the hosts and the hosts reach them.
# RATE: optional tc tbf rate for every host's link (e.g. 2gbit), applied on both directions,
#   with a 256 KB burst and a queue of RT_NETNS_TBF_LATENCY (default 50ms) at that rate.
#   This kernel has no netem: bandwidth can be shaped, latency cannot.
# Enter a host with nsenter --net=/run/netns/HOST (not `ip netns exec`, which remounts /sys
# and breaks slurmd's cgroup lookup). Give it its own host name too (`unshare --uts` then
# `hostname HOST`, as rsh_agent.sh does): Open MPI names its shared-memory files after the
# host name, and two emulated hosts named alike corrupt each other's (a crash in vader).
# Needs root and iproute2.

netns_supported() {
    # Prints nothing and succeeds when namespaces can be made here; otherwise prints why.
    if [ "$(id -u)" != 0 ]; then echo "network namespaces need root"; return 1; fi
    command -v ip >/dev/null || { echo "iproute2 (ip) not installed"; return 1; }
    command -v nsenter >/dev/null || { echo "nsenter (util-linux) not installed"; return 1; }
    local probe="rtprobe$$"
    if ! ip netns add "$probe" 2>/dev/null; then echo "ip netns add failed (no CAP_SYS_ADMIN?)"; return 1; fi
    if ! ip link add "${probe}b" type bridge 2>/dev/null; then
        ip netns del "$probe"; echo "cannot create a bridge (no CAP_NET_ADMIN?)"; return 1
    fi
    ip link del "${probe}b"; ip netns del "$probe"
}

netns_hosts() {
    local prefix=$1 f
    for f in /run/netns/"$prefix"[0-9]*; do [ -e "$f" ] && basename "$f"; done | sort -V
}

netns_addr() { echo "$(cat "/run/rt-netns/$1.subnet" 2>/dev/null || echo "?").$(( $2 + 1 ))"; }

netns_exec() { local host=$1; shift; nsenter --net="/run/netns/$host" "$@"; }

netns_create() {
    local prefix=$1 n=$2 subnet=$3 rate=${4:-}
    case $prefix in ''|*[!A-Za-z0-9]*) echo "netns_create: bad prefix '$prefix'" >&2; return 2;; esac
    [ ${#prefix} -le 8 ] || { echo "netns_create: prefix '$prefix' longer than 8" >&2; return 2; }
    [ "$prefix" != "$(hostname)" ] || { echo "netns_create: prefix equals the hostname" >&2; return 2; }
    local br="${prefix}br" i host q=${RT_NETNS_TBF_LATENCY:-50ms}
    ip link add "$br" type bridge || return 1
    ip addr add "$subnet.254/24" dev "$br" && ip link set "$br" up || { netns_destroy "$prefix"; return 1; }
    mkdir -p /run/rt-netns && echo "$subnet" > "/run/rt-netns/$prefix.subnet"
    for i in $(seq 1 "$n"); do
        host="$prefix$i"
        ip netns add "$host" &&
        ip link add "${prefix}v$i" type veth peer name "${prefix}p$i" &&
        ip link set "${prefix}p$i" netns "$host" &&
        ip link set "${prefix}v$i" master "$br" &&
        ip link set "${prefix}v$i" up &&
        ip -n "$host" link set lo up &&
        ip -n "$host" link set "${prefix}p$i" name eth0 &&
        ip -n "$host" addr add "$subnet.$((i + 1))/24" dev eth0 &&
        ip -n "$host" link set eth0 up &&
        ip -n "$host" route add default via "$subnet.254" || { netns_destroy "$prefix"; return 1; }
        if [ -n "$rate" ]; then
            # Egress of each end: the host's eth0 (host -> bridge) and the bridge port (bridge -> host).
            nsenter --net="/run/netns/$host" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency "$q" &&
            tc qdisc add dev "${prefix}v$i" root tbf rate "$rate" burst 256kb latency "$q" ||
                { netns_destroy "$prefix"; return 1; }
        fi
    done
}

netns_destroy() {
    local prefix=$1 host
    for host in $(netns_hosts "$prefix"); do
        # Processes still inside keep the namespace's links alive; end them first.
        ip netns pids "$host" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$host" 2>/dev/null
    done
    ip link del "${prefix}br" 2>/dev/null
    rm -f "/run/rt-netns/$prefix.subnet"
    return 0
}
