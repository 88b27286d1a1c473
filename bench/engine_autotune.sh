#!/usr/bin/env bash
# comm.autotune against a brute-force grid of the same settings, on this machine:
#   bench/engine_autotune.sh [OUT]        (OUT: docs/data/autotune; about 15 minutes at 2 ranks on 2 cores)
# 1. one autotuned run (its log: OUT/autotune_log.csv), to learn the job's gradient bytes;
# 2. the grid: every fusion threshold the tuner would try x cycle times x one algorithm for all sizes
#    (the settings a configuration can fix), each a run of 2 epochs of STEPS steps; the second
#    epoch's img/s is the steady state (OUT/grid.csv);
# 3. the grid's best point and the autotuned job, interleaved REPEATS times (the machine is shared
#    and loaded: medians of interleaved runs), OUT/ab.csv, and the summary OUT/summary.txt.
# Environment: MODEL (cnn), NP (2), BATCH (64 per rank), STEPS (90 per epoch: the search needs at
#   most 2 + samples x steps = 82), TUNE_STEPS (comm.autotune_steps, 4: the step times of this loaded
#   machine vary by +-30%; the fastest of the 3 counted steps is the sample), CYCLES ("0.5 1 2 5"), ALGOS ("ring tree shm"), REPEATS (3),
#   LAUNCH (mpirun --oversubscribe --bind-to none), BIN (build/ringtrain).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/data/autotune}; mkdir -p "$OUT"
BIN=${BIN:-build/ringtrain}; MODEL=${MODEL:-cnn}; NP=${NP:-2}; BATCH=${BATCH:-64}; STEPS=${STEPS:-90}; TUNE_STEPS=${TUNE_STEPS:-4}
CYCLES=${CYCLES:-0.5 1 2 5}; ALGOS=${ALGOS:-ring tree shm}; REPEATS=${REPEATS:-3}
LAUNCH=${LAUNCH:-mpirun --oversubscribe --bind-to none}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none NP LAUNCH
[ -x "$BIN" ] || { echo "engine_autotune: '$BIN' missing: build ringtrain first" >&2; exit 2; }
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
DATA=$TMP/data
"$BIN" prepare --dataset synthetic --samples $((STEPS * BATCH * NP)) --test-samples 64 --channels 1 --height 28 \
    --width 28 --classes 10 --out "$DATA" > /dev/null

# run NAME SETTINGS...: 2 epochs; prints the second epoch's img/s.
run() {
    local name=$1; shift
    $LAUNCH -np "$NP" -x OMP_NUM_THREADS=1 "$BIN" train --config jobs/fashion_cnn.toml --set model.name="$MODEL" \
        --set data.train="$DATA" --set data.test="$DATA" --set data.batch_size="$BATCH" --set train.epochs=2 \
        --set checkpoint.dir= --set log.metrics="$TMP/$name.jsonl" --set log.format=plain --no-eval "$@" \
        > "$TMP/$name.log" 2>&1 || { cat "$TMP/$name.log" >&2; exit 1; }
    /usr/bin/python3 -c 'import json, sys
e = [j for j in map(json.loads, open(sys.argv[1])) if j.get("event") == "epoch"]
print("%.1f" % e[-1]["images_per_s"])' "$TMP/$name.jsonl"
}
AUTO=(--set comm.autotune=true --set comm.autotune_steps="$TUNE_STEPS" --set comm.autotune_log="$OUT/autotune_log.csv")

echo "== autotuned run (learns the gradient bytes per step)"
auto=$(run auto "${AUTO[@]}")
bytes=$(sed -n 's/^# .* tensors and \([0-9]*\) bytes per step.*/\1/p' "$OUT/autotune_log.csv")
fusions=""; f=262144
while :; do fusions="$fusions $f"; [ "$f" -ge "$bytes" ] && break; f=$((f * 4)); done
echo "gradient bytes per step: $bytes; fusion thresholds:$fusions"

echo "fusion_threshold,cycle_time_ms,algorithm,images_per_s" > "$OUT/grid.csv"
for a in $ALGOS; do for c in $CYCLES; do for f in $fusions; do
    v=$(run grid --set comm.fusion_threshold="$f" --set comm.cycle_time_ms="$c" --set comm.algorithm="$a")
    echo "$f,$c,$a,$v" | tee -a "$OUT/grid.csv"
done; done; done
best=$(tail -n +2 "$OUT/grid.csv" | sort -t, -k4 -g | tail -1)
worst=$(tail -n +2 "$OUT/grid.csv" | sort -t, -k4 -g | head -1)
IFS=, read -r bf bc ba bv <<< "$best"

echo "run,setting,images_per_s" > "$OUT/ab.csv"
for i in $(seq "$REPEATS"); do
    echo "$i,grid best,$(run best --set comm.fusion_threshold="$bf" --set comm.cycle_time_ms="$bc" --set comm.algorithm="$ba")" >> "$OUT/ab.csv"
    echo "$i,autotune,$(run auto "${AUTO[@]}" --set comm.autotune_log="$TMP/log$i.csv")" >> "$OUT/ab.csv"
done
/usr/bin/python3 - "$OUT" "$best" "$worst" "$auto" <<'EOF' | tee "$OUT/summary.txt"
import csv, statistics, sys
out, best, worst, auto_first = sys.argv[1:]
rows = list(csv.DictReader(open(f"{out}/ab.csv")))
med = {s: statistics.median(float(r["images_per_s"]) for r in rows if r["setting"] == s) for s in ("grid best", "autotune")}
log = [r for r in csv.DictReader(l for l in open(f"{out}/autotune_log.csv") if not l.startswith("#"))]
chosen = [r for r in log if r["chosen"] == "1"][0]
import os
load = open("/proc/loadavg").read().split()[0]
print(f"measured, {os.environ.get('NP', '2')} ranks, {os.environ.get('LAUNCH', 'mpirun on this machine')}; load average "
      f"{load} at the end (the benchmark's own ranks count); steady state = 2nd epoch img/s")
print(f"grid: {sum(1 for _ in open(f'{out}/grid.csv')) - 1} points; best {best}; worst {worst}; "
      f"spread {float(best.split(',')[3]) / float(worst.split(',')[3]):.2f}x")
print(f"autotune (first run): chose fusion {chosen['fusion_threshold']} B, cycle {chosen['cycle_time_ms']} ms, "
      f"{chosen['small_algorithm']}/{chosen['large_algorithm']} after {len(log) - 1} samples; 2nd epoch {auto_first} img/s")
print(f"interleaved medians of {len(rows) // 2} runs: grid best {med['grid best']:.1f} img/s, autotune "
      f"{med['autotune']:.1f} img/s: autotune / grid best = {med['autotune'] / med['grid best']:.3f} (goal >= 0.95)")
EOF
