#!/usr/bin/env bash
# Pipeline schedules on real models from the CLI: cnn, vit (Fashion-MNIST) and
# gpt (fortunes) at pipeline 2 (2 ranks on the 2 cores), m = 4, every schedule,
# next to data 2 on the same ranks. Prints, per run, the epoch's images/s (or
# tokens/s), the pipeline schedule's measured ms/step and the simulator's
# prediction from the same epoch's per-chunk costs and measured link, the
# message time, the prediction with free messages and the mean of each step played with its
# own costs (the trainer's epoch line), the median measured step, the median of the per-step plays and the
# busiest rank's compute at the mean costs (no table of the cut runs faster),
# and the bound of 1F1B: m/(m+p-1) x data 2's throughput.
# Rounds are interleaved (every row once per round); each row prints the 1-minute load average
# at its start; the end prints each row's median over the rounds (MODELS="cnn vit gpt" selects).
#   bench/pipeline_schedules.sh [build-dir] [rounds]   (data: make prepare prepare-text)
# CUT=fixed: every row of a model runs one fixed cut (parallel.partition = list: the cuts that
# partition = time chose in one run, below) instead of timing its layers at start, so that the
# ratios between schedules do not follow a cut taken under changing load.
# SCHEDULES="1f1b zb-h1" selects schedules; ALSO_DATA2=0 leaves out the data 2 row.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() {  # model-config extra-sets...
  local cfg=$1; shift
  local log
  log=$(mpirun -np 2 --oversubscribe --bind-to none "$B/ringtrain" train --config "$cfg" --no-eval \
    --set train.epochs=1 --set schedule.warmup_epochs=0.1 --set checkpoint.dir= --set log.format=plain "$@" 2>&1)
  # the last column: the table parallel.replan_steps kept after timing each (rebuilt / whole / unit / -)
  local re=-
  grep -q "parallel.schedule = .*: running the rebuilt table" <<<"$log" && re=rebuilt
  grep -q "parallel.schedule = .*: running every backward whole" <<<"$log" && re=whole
  grep -q "parallel.schedule = .*: running the unit-cost table" <<<"$log" && re=unit
  grep -A3 "parallel.schedule = .*timing it" <<<"$log" | grep -v "^--" | sed 's/^\[[^]]*\] //; s/^/#   /' >&2 || true  # the replan's lines (and its table), before the row
  grep -E "median step over|: running " <<<"$log" | grep -v "timing it" | sed 's/^\[[^]]*\] /#   /' >&2 || true
  echo "$(grep "epoch 1/1:" <<<"$log" |
    perl -pe 's/.*\| ([0-9]+ (img|tokens)\/s)[^|]*(\| pipeline schedule ([0-9.]+) ms\/step \(median ([0-9.]+)\), simulator ([0-9.]+) ms \(bubble [0-9]+%; messages ([0-9]+) us; ([0-9.]+) ms with free messages; ([0-9.]+) ms from per-step costs, median ([0-9.]+); the busiest rank computes ([0-9.]+) ms\))?.*/$1 $4 $6 $7 $8 $9 $5 $10 $11/') $re"
}
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) ($(nproc) cores), load $(cut -d' ' -f1-3 /proc/loadavg), CUT=${CUT:-time}"
MODELS=${MODELS:-cnn vit gpt}
SCHEDULES=${SCHEDULES:-1f1b zb-h1 interleaved zb-v}  # and data2 (ALSO_DATA2=0 leaves it out)
load() { cut -d' ' -f1 /proc/loadavg; }
echo "# round model layout load rate unit schedule_ms predicted_ms message_us predicted_free_ms predicted_steps_ms median_ms predicted_steps_median_ms busiest_ms table"
out=$(mktemp)
for r in $(seq "$ROUNDS"); do
  # model config batch cut-of-2-stages cut-of-4-chunks (layers per stage/chunk; CUT=fixed)
  for spec in "cnn jobs/fashion_cnn.toml data.batch_size=512 [1,4] [1,1,1,2]" \
              "vit jobs/fashion_vit.toml data.batch_size=256 [3,5] [2,1,1,4]" \
              "gpt jobs/text_gpt.toml data.batch_size=32 [3,4] [2,1,1,3]"; do
    read -r name cfg b cut2 cut4 <<<"$spec"
    [[ " $MODELS " == *" $name "* ]] || continue
    m=$(basename "$cfg" .toml)
    # data 2: each rank half the global batch
    half=$(( ${b#*=} / 2 ))
    l=$(load)
    [ "${ALSO_DATA2:-1}" = 0 ] || echo "$r $m data2 $l $(run "$cfg" --set data.batch_size=$half)" | tee -a "$out"
    for s in $SCHEDULES; do
      l=$(load)
      part=(--set parallel.partition=time)
      if [ "${CUT:-time}" = fixed ]; then
        cut=$cut2; case $s in interleaved|zb-v) cut=$cut4 ;; esac
        part=(--set parallel.partition=list --set "parallel.balance=$cut")
      fi
      echo "$r $m $s $l $(run "$cfg" --set "$b" "${part[@]}" --set parallel.pipeline=2 --set parallel.micro_batches=4 \
        --set parallel.schedule=$s)" | tee -a "$out"
    done
  done
done
echo "# medians over $ROUNDS round(s): model layout load rate unit schedule_ms predicted_ms err(measured/predicted-1) predicted_steps_ms err_steps median_ms err_median busiest_ms [table per round]"
python3 - "$out" <<'PY'
import sys, statistics as st, collections
rows = collections.OrderedDict()
tables = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 7 and f[-1] in ("-", "rebuilt", "whole", "unit"): tables[(f[1], f[2])].append(f.pop())
    if len(f) >= 6: rows.setdefault((f[1], f[2]), []).append(f)
for (m, lay), fs in rows.items():
    med = lambda i: st.median(float(f[i]) for f in fs) if all(len(f) > i for f in fs) else None
    rate, load = med(4), med(3)
    s = f"{m} {lay} {load:.1f} {rate:.0f} {fs[0][5]}"
    sm, pm = med(6), med(7)
    if sm is not None and pm is not None:
        errs = [float(f[6]) / float(f[7]) - 1 for f in fs]
        s += f" {sm:.1f} {pm:.1f} {st.median(errs):+.3f}"
        if all(len(f) > 10 for f in fs):  # the prediction from each step's own costs
            es = [float(f[6]) / float(f[10]) - 1 for f in fs]
            s += f" {med(10):.1f} {st.median(es):+.3f}"
        if all(len(f) > 13 for f in fs):  # median step against the median per-step play; the busiest rank
            em = [float(f[11]) / float(f[12]) - 1 for f in fs]
            s += f" {med(11):.1f} {st.median(em):+.3f} {med(13):.1f}"
    if any(t != "-" for t in tables[(m, lay)]): s += " " + ",".join(tables[(m, lay)])
    print(s)
PY
rm -f "$out"
