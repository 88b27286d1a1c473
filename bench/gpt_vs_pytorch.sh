#!/usr/bin/env bash
# The gpt training step against PyTorch on one thread (bench_nn_gpt_vs_pytorch):
# the small model and GPT-2 124M's shape, fp32 and bf16, alternating rounds.
#   bench/gpt_vs_pytorch.sh OUT [BUILD_DIR] [-- extra bench_nn_gpt_vs_pytorch options]
# writes OUT.txt (the printed table, with the command, CPU and load at the top)
# and OUT.json. About 5 minutes on an idle core with the defaults (PyTorch's fp32
# 124M step alone takes 35-45 s); knobs: --rounds/--steps/--warmup (small),
# --big-rounds/--big-steps/--big-warmup (124m), --sizes, --precisions.
set -euo pipefail
OUT=${1:?usage: bench/gpt_vs_pytorch.sh OUT [BUILD_DIR] [-- options]}
shift
BUILD=build
if [[ $# -gt 0 && $1 != -- ]]; then BUILD=$1; shift; fi
[[ ${1:-} == -- ]] && shift
BIN=$BUILD/bench/bench_nn_gpt_vs_pytorch
[[ -x $BIN ]] || { echo "$BIN not built (cmake --build $BUILD --target bench_nn_gpt_vs_pytorch)" >&2; exit 1; }
SRC=$(cd "$(dirname "$0")" && pwd)
CMD=(env OMP_NUM_THREADS=1 "$BIN" --threads 1 --torch-script "$SRC/reference/torch_gpt_step.py" --json "$OUT.json" "$@")
{
  echo "# ${CMD[*]}"
  echo "# $(date -u +%FT%TZ); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) CPUs;" \
       "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  "${CMD[@]}"
  echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT.txt"
