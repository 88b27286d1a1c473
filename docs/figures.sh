#!/usr/bin/env bash
# The figures of docs/: PNG plots drawn from the data under docs/data/ (`make figures`).
#   docs/figures.sh [BUILD]               redraw every plot from docs/data/*.csv (seconds)
#   MEASURE=1 docs/figures.sh [BUILD]     first measure all the data again on this machine (about 10 min
#                                         of 2 cores; needs `make build`), recording the CPU and the
#                                         load average next to each CSV (docs/data/<name>.machine.txt)
#   MEASURE="allreduce_np2 parallel_layouts" ...   only those (names: allreduce_np2 pipeline_bubble
#                                         parallel_layouts smpi; smpi needs smpicxx, ~3 min)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
D=docs/data
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPI=(jobs/mpirun.sh)

machine() {  # machine NAME COMMAND...: run it, writing the CPU, the load before/after and the command
  local name=$1; shift
  local before; before=$(cut -d' ' -f1-3 /proc/loadavg)
  "$@"
  { echo "command: $*"
    echo "cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(getconf _NPROCESSORS_ONLN) logical CPUs"
    echo "load average (1/5/15 min) before: $before, after: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "date: $(date -u +%FT%TZ)"; } > "$D/$name.machine.txt"
}

want() { [ "${MEASURE:-0}" = 1 ] || [[ " ${MEASURE:-} " == *" $1 "* ]]; }
need() { [ -x "$B/bench/$1" ] || { echo "figures: $B/bench/$1 missing (make build)" >&2; exit 2; }; }
if want allreduce_np2; then
  need bench_comm_allreduce_sweep; rm -f "$D/allreduce_np2.csv"
  machine allreduce_np2 "${MPI[@]}" -np 2 "$B/bench/bench_comm_allreduce_sweep" -b 8 -e 64M -f 4 -n 10 -w 3 -c 1 \
      --csv "$D/allreduce_np2.csv"
fi
if want pipeline_bubble; then
  need bench_parallel_bubble; rm -f "$D/pipeline_bubble.csv"
  # the bubble sweep at p = 2, 4, 8 stages (its machine.txt names the function "bubble")
  bubble() { for p in 2 4 8; do "${MPI[@]}" -np "$p" "$B/bench/bench_parallel_bubble" --unit-ms 10 --csv "$D/pipeline_bubble.csv"; done; }
  machine pipeline_bubble bubble
fi
if want parallel_layouts; then
  need bench_parallel_layouts; rm -f "$D/parallel_layouts.csv"
  machine parallel_layouts "${MPI[@]}" -np 2 "$B/bench/bench_parallel_layouts" --csv "$D/parallel_layouts.csv"
fi
if want smpi; then
  # SimGrid: simulated times, independent of this machine's load (docs/scaling.md)
  machine smpi env RING_MAX_RANKS=64 OUT=runs/smpi-docs jobs/smpi/run.sh
  mkdir -p "$D/smpi"; cp runs/smpi-docs/smpi.csv runs/smpi-docs/smpi.txt "$D/smpi/"; mv "$D/smpi.machine.txt" "$D/smpi/machine.txt"
fi
/usr/bin/python3 docs/plot_figures.py "$D" docs
