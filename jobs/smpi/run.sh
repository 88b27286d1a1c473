#!/usr/bin/env bash
# SMPI simulation of ringtrain's own all-reduce (src/comm, compiled with smpicxx) on a generated
# cluster platform, compared with jobs/costmodel.py's formulas for the same α, β:
#   jobs/smpi/run.sh loop) advance simulated time by 1 us each.                     16..1,024 ranks, 4 per node, 25 Gbit/s, a few minutes
# Environment: RANKS ("16 64 256 1024"), SIZES ("4K 64K 1M"), GBIT (25), LAT_US (15), PPN (4),
#   SHM_GBYTE (20), SHM_LAT_US (1), OUT (runs/smpi), RING_MAX_RANKS (256: the ring's 2(p-1) steps
#   x p polling ranks take ~30 s of simulation per point at 256 ranks, ~8 min at 1,024; above it
#   only the tree is simulated), SMPI_TEST (1e-7 s per MPI_Test poll).
# Writes OUT/smpi.csv (ranks, algorithm, bytes, simulated and predicted us) and OUT/smpi.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
RANKS=${RANKS:-16 64 256 1024}; SIZES=${SIZES:-4K 64K 1M}
GBIT=${GBIT:-25}; LAT_US=${LAT_US:-15}; PPN=${PPN:-4}; SHM_GBYTE=${SHM_GBYTE:-20}; SHM_LAT_US=${SHM_LAT_US:-1}
OUT=${OUT:-runs/smpi}; BUILD=${SMPI_BUILD:-build-smpi}
command -v smpicxx >/dev/null || { echo "jobs/smpi/run.sh: smpicxx not found (Debian package libsimgrid-dev; make deps)" >&2; exit 2; }
mkdir -p "$OUT" "$BUILD"

# Build: the comm library and core, unchanged, each object rebuilt only when its source changed.
objs=()
for src in src/core/*.cpp src/comm/*.cpp jobs/smpi/smpi_allreduce.cpp; do
o="$BUILD/$(echo "${src%.cpp}" | tr / _).o"
if [ ! -f "$o" ] || [ "$src" -nt "$o" ] || [ -n "$(find include -newer "$o" -name '*.hpp' | head -1)" ]; then
    echo "smpicxx $src"
    smpicxx -std=c++20 -O2 -fopenmp -Iinclude -c "$src" -o "$o" 2>&1 | grep -v "^$" | grep -iE "error" && exit 1
fi
objs+=("$o")
done
smpicxx -fopenmp "${objs[@]}" -o "$BUILD/smpi_allreduce"

# Platform: one cluster, PPN ranks per host (loopback = shared memory), full-duplex links to a
# non-blocking backbone (a fat tree's full bisection).
platform() {  # platform NODES > file
cat <<XML
<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <cluster id="c" prefix="node" suffix="" radical="0-$(( $1 - 1 ))" speed="100Gf"
       bw="${GBIT}Gbps" lat="${LAT_US}us" sharing_policy="SPLITDUPLEX"
       bb_bw="$(( $1 * ${GBIT%.*} * 2 ))Gbps" bb_lat="0us" bb_sharing_policy="SHARED"
       loopback_bw="${SHM_GBYTE}GBps" loopback_lat="${SHM_LAT_US}us"/>
</platform>
XML
}
csv=$OUT/smpi-raw.csv; : > "$csv"
for p in $RANKS; do
    nodes=$(( (p + PPN - 1) / PPN ))
    platform "$nodes" > "$OUT/cluster-$nodes.xml"
    for i in $(seq 0 $((nodes - 1))); do for _ in $(seq 1 "$PPN"); do echo "node$i"; done; done > "$OUT/hosts-$nodes"
    echo "== smpirun: $p ranks on $nodes nodes ($GBIT Gbit/s, ${LAT_US} us), sizes $SIZES"
    start=$SECONDS
    # Computation is not simulated (gamma = 0 on both sides). Each MPI_Test poll of the transport's
    # wait loop advances simulated time by SMPI_TEST (0.1 us). Two network models: "ab" = plain
    # latency + size/bandwidth (what the cost model assumes); "smpi" = SMPI's default piecewise
    # factors, calibrated on a real cluster's MPI (latency x2..x11, bandwidth x0.4..x0.94 by size).
    for net in ab smpi; do
        factors=()
        [ $net = ab ] && factors=(--cfg=smpi/lat-factor:0:1 --cfg=smpi/bw-factor:0:1)
        algos=ring,tree; [ "$p" -le "${RING_MAX_RANKS:-256}" ] || algos=tree
        SMPI_ALGOS=$algos smpirun -np "$p" -platform "$OUT/cluster-$nodes.xml" \
            -hostfile "$OUT/hosts-$nodes" --cfg=smpi/simulate-computation:no --cfg=smpi/test:${SMPI_TEST:-1e-7} \
            --cfg=smpi/privatization:dlopen "${factors[@]}" --log=root.thres:critical \
            "$BUILD/smpi_allreduce" $SIZES 2> "$OUT/smpirun-$p-$net.err" | sed "s/^/$net,/" | tee -a "$csv"
    done
    echo "   ($((SECONDS - start)) s wall)"
done
/usr/bin/python3 jobs/smpi/compare.py "$csv" "$OUT" --gbit "$GBIT" --lat-us "$LAT_US" --ppn "$PPN" \
    --shm-gbyte "$SHM_GBYTE" --shm-lat-us "$SHM_LAT_US"
