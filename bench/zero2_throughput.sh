#!/usr/bin/env bash
# ZeRO-2 against plain data parallelism at 2 ranks, on the CLI users run: the
# README's cnn job for STEPS steps, A (parallel.zero = 0), B (parallel.zero = 2)
# and C (parallel.zero = 2, parallel.zero_release = false) interleaved for ROUNDS
# rounds; each run's last "images_per_s" record, then the medians, B/A and C/A.
#   bench/zero2_throughput.sh [BUILD_DIR] [OUT] [ROUNDS] [STEPS]
# DATA (default data/fashion-mnist) holds fashion-mnist-{train,test}.h5.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-docs/data/zero2_throughput.txt}
ROUNDS=${3:-5}
STEPS=${4:-300}
DATA=${DATA:-data/fashion-mnist}
MPI=(mpirun -np 2 --bind-to none --oversubscribe)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
run() {  # $1: parallel.zero, $2: parallel.zero_release; prints the last images_per_s
  "${MPI[@]}" "$BUILD/ringtrain" train --config jobs/fashion_cnn.toml --set train.max_steps="$STEPS" \
      --set data.train="$DATA" --set data.test="$DATA" --set log.format=json --set checkpoint.dir= --no-eval \
      --set parallel.zero="$1" --set parallel.zero_release="$2" 2>&1 | grep -o '"images_per_s": *[0-9.e+-]*' | tail -1 | sed 's/.*: *//'
}
{
  echo "# ZeRO-2 vs plain data parallelism, 2 ranks, cnn (jobs/fashion_cnn.toml), $STEPS steps per run, $(date -u +%FT%TZ)"
  echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
  echo "# command (A: Z=0 R=true, B: Z=2 R=true, C: Z=2 R=false): ${MPI[*]} $BUILD/ringtrain train --config jobs/fashion_cnn.toml --set train.max_steps=$STEPS --set data.train=$DATA --set data.test=$DATA --set log.format=json --set checkpoint.dir= --no-eval --set parallel.zero=Z --set parallel.zero_release=R"
  echo "round,zero0_images_per_s,zero2_images_per_s,zero2_no_release_images_per_s"
} > "$OUT"
a=() b=() c=()
for r in $(seq 1 "$ROUNDS"); do
  x=$(run 0 true); y=$(run 2 true); z=$(run 2 false)
  a+=("$x"); b+=("$y"); c+=("$z")
  echo "$r,$x,$y,$z" | tee -a "$OUT" >&2
done
python3 - "${a[*]}" "${b[*]}" "${c[*]}" >> "$OUT" <<'PY'
import statistics, sys
a, b, c = ([float(v) for v in arg.split()] for arg in sys.argv[1:4])
ma, mb, mc = statistics.median(a), statistics.median(b), statistics.median(c)
print(f"# median zero=0 {ma:.1f} images/s, zero=2 {mb:.1f} ({mb/ma:.3f}x), zero=2 without release {mc:.1f} ({mc/ma:.3f}x)")
PY
tail -1 "$OUT"
