# Minimal emulated hosts for the Slurm test cluster: a library to source.
#   slurm_netns_create PREFIX N SUBNET [RATE]  hosts PREFIX1..PREFIXN, bridge PREFIXbr at SUBNET.254,
#                                        host I at SUBNET.I (veth on the bridge); RATE (e.g. 2gbit):
#                                        tc tbf on both ends of every host's link (no netem here:
#                                        bandwidth can be shaped, latency cannot)
#   slurm_netns_destroy PREFIX           ends processes inside, removes namespaces, links, bridge
# Enter a host with `nsenter --net=/run/netns/HOST` (`ip netns exec` remounts /sys and
# slurmd then fails with "No filesystem mounted on /sys/fs/cgroup").
# TODO(unify): tests/hosts/netns.sh (collectives stream) does the same with tc shaping;
# this copy exists so the Slurm work does not depend on that branch.

slurm_netns_create() {
    local prefix=$1 n=$2 subnet=$3 rate=${4:-} i host
    case $prefix in ''|*[!A-Za-z0-9]*) echo "netns: bad prefix '$prefix'" >&2; return 2;; esac
    [ ${#prefix} -le 8 ] || { echo "netns: prefix '$prefix' longer than 8 characters" >&2; return 2; }
    ip link add "${prefix}br" type bridge || return 1
    ip addr add "$subnet.254/24" dev "${prefix}br" && ip link set "${prefix}br" up || return 1
    for i in $(seq 1 "$n"); do
        host="$prefix$i"
        ip netns add "$host" &&
        ip link add "${prefix}v$i" type veth peer name "${prefix}p$i" &&
        ip link set "${prefix}p$i" netns "$host" &&
        ip link set "${prefix}v$i" master "${prefix}br" &&
        ip link set "${prefix}v$i" up &&
        ip -n "$host" link set lo up &&
        ip -n "$host" link set "${prefix}p$i" name eth0 &&
        ip -n "$host" addr add "$subnet.$i/24" dev eth0 &&
        ip -n "$host" link set eth0 up &&
        ip -n "$host" route add default via "$subnet.254" || return 1
        if [ -n "$rate" ]; then
            nsenter --net="/run/netns/$host" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms &&
            tc qdisc add dev "${prefix}v$i" root tbf rate "$rate" burst 256kb latency 50ms || return 1
        fi
    done
}

slurm_netns_destroy() {
    local prefix=$1 f host
    for f in /run/netns/"$prefix"[0-9]*; do
        [ -e "$f" ] || continue
        host=$(basename "$f")
        # Processes left inside keep the namespace's links alive.
        ip netns pids "$host" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$host" 2>/dev/null
    done
    ip link del "${prefix}br" 2>/dev/null
    return 0
}
