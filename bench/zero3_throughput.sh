#!/usr/bin/env bash
# ZeRO-3 against plain data parallelism at 2 ranks, on the CLI users run: the
# jobs/fashion_<model>.toml job for STEPS steps, A (parallel.zero = 0) and
# B (parallel.zero = 3) interleaved for ROUNDS rounds per model; each run's last
# "images_per_s" record, then the medians and B/A (goal: >= 0.9).
#   bench/zero3_throughput.sh [BUILD_DIR] [OUT] [ROUNDS] [STEPS]
# MODELS (default "cnn vit"); DATA (default data/fashion-mnist) holds fashion-mnist-{train,test}.h5.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-docs/data/zero3_throughput.txt}
ROUNDS=${3:-5}
STEPS=${4:-100}
DATA=${DATA:-data/fashion-mnist}
MPI=(mpirun -np 2 --bind-to none --oversubscribe)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
run() {  # $1: model, $2: parallel.zero; prints the last images_per_s
  "${MPI[@]}" "$BUILD/ringtrain" train --config "jobs/fashion_$1.toml" --set train.max_steps="$STEPS" \
      --set data.train="$DATA" --set data.test="$DATA" --set log.format=json --set checkpoint.dir= --no-eval \
      --set parallel.zero="$2" 2>&1 | grep -o '"images_per_s": *[0-9.e+-]*' | tail -1 | sed 's/.*: *//'
}
{
  echo "# ZeRO-3 vs plain data parallelism, 2 ranks, $STEPS steps per run, $(date -u +%FT%TZ)"
  echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# command (A: Z=0, B: Z=3): ${MPI[*]} $BUILD/ringtrain train --config jobs/fashion_MODEL.toml --set train.max_steps=$STEPS --set data.train=$DATA --set data.test=$DATA --set log.format=json --set checkpoint.dir= --no-eval --set parallel.zero=Z"
  echo "model,round,zero0_images_per_s,zero3_images_per_s"
} > "$OUT"
for model in ${MODELS:-cnn vit}; do
  a=() b=()
  for r in $(seq 1 "$ROUNDS"); do
    x=$(run "$model" 0); y=$(run "$model" 3)
    a+=("$x"); b+=("$y")
    echo "$model,$r,$x,$y" | tee -a "$OUT" >&2
  done
  python3 - "$model" "${a[*]}" "${b[*]}" >> "$OUT" <<'PY'
import statistics, sys
model = sys.argv[1]
a, b = ([float(v) for v in arg.split()] for arg in sys.argv[2:4])
ma, mb = statistics.median(a), statistics.median(b)
print(f"# {model}: median zero=0 {ma:.1f} images/s, zero=3 {mb:.1f} ({mb/ma:.3f}x)")
PY
done
grep '^# .*median' "$OUT"
