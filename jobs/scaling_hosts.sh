#!/usr/bin/env bash
# Inside a test cluster (tests/slurm/cluster.sh run 4 -- jobs/scaling_hosts.sh CLASS), called by
# jobs/scaling_study.sh: sweeps over 2 (fit), 3 and 4 (validation) emulated hosts, one rank each,
# and weak-scaling training of `cnn` on 2 and 4 hosts, as Slurm allocations (salloc -N k mpirun).
# CLASS slow: link-bound sizes (SLOW_SWEEP) and SLOW_STEPS training steps on slowly shaped links.
set -euo pipefail
CLASS=$1
cd "$(dirname "$0")/.."
SALLOC() { local k=$1; shift; salloc -Q -N "$k" --ntasks-per-node=1 "$@"; }
args=$SWEEP steps=${STEPS:-60}
[ "$CLASS" = slow ] && args=$SLOW_SWEEP steps=$SLOW_STEPS
for k in ${HOST_SWEEP:-2 3 4}; do
    echo "== sweep: $CLASS, $k hosts"
    SALLOC "$k" mpirun -np "$k" "$BENCH" $args --csv "$OUT/sweeps/$CLASS-${k}n${k}r.csv" > "$OUT/sweeps/$CLASS-${k}n${k}r.txt"
done
for k in ${HOST_TRAIN:-2 3 4}; do
    train "hosts-$CLASS" weak cnn "$k" "$k" "${BATCH:-64}" "$steps" SALLOC "$k" mpirun
done
