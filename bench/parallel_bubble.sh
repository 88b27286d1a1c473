#!/usr/bin/env bash
# Pipeline bubble sweep: p in {2, 4, 8}, m in {1..32}, every schedule; writes
# runs/bench/pipeline_bubble.csv and pipeline_bubble.png (stage compute is a
# timed sleep, see bench/parallel_bubble.cpp). Usage: bench/parallel_bubble.sh [build-dir] [unit-ms]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
UNIT=${2:-10}
OUT=runs/bench
mkdir -p "$OUT"
rm -f "$OUT/pipeline_bubble.csv"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for p in 2 4 8; do
  mpirun --oversubscribe --bind-to none -np "$p" "$B/bench/bench_parallel_bubble" --unit-ms "$UNIT" \
    --csv "$OUT/pipeline_bubble.csv"
done
# The plot is docs/plot_figures.py's (the figure of docs/parallel_layouts.md).
/usr/bin/python3 -c 'import sys; sys.path.insert(0, "docs"); import plot_figures; plot_figures.pipeline_bubble(*sys.argv[1:3])' \
    "$OUT/pipeline_bubble.csv" "$OUT/pipeline_bubble.png"
echo "wrote $OUT/pipeline_bubble.png"
