#!/usr/bin/env bash
# CTest slurm/scaling_short: jobs/scaling_study.sh end to end on 2 training points: cnn weak
# scaling at 1 rank here and on 2 emulated hosts of a Slurm cluster the study brings up and
# removes itself (tests/slurm/cluster.sh run, the test's instance name), then the report.
# Checks the files, the report's first lines against scaling.csv, and that no namespace,
# bridge or daemon of the instance is left.
# Usage: scaling_short.sh SRC_DIR RINGTRAIN_BIN BENCH_BIN
set -uo pipefail
SRC=$1; BIN=$2; BENCH=$3
why=$("$SRC/tests/slurm/cluster.sh" check) || { echo "SKIPPED: $why"; exit 77; }
. "$(dirname "$0")/lib.sh"
WORK=$(mktemp -d /tmp/rt-scaling-short.XXXXXX); trap 'rm -rf "$WORK"' EXIT
NAME=${RT_SLURM_NAME:-rtslm}

# 2 points, 6 steps each; a 3-size shared-memory sweep for the fit (the report needs one).
OUT=$WORK/out BIN=$BIN BENCH=$BENCH STEPS=6 PHASES="local hosts" LOCAL_RANKS=1 MODES=weak EXTRA_MODELS= \
    SHM_SWEEP_RANKS=2 HOST_CLASSES=net HOST_SWEEP=2 HOST_TRAIN=2 \
    SWEEP="-b 4K -e 1M -f 16 -w 1 -n 3 -c 0 --algos ring,tree --stat min" \
    REPORT_ARGS="--ranks 64 --ranks-per-node 4 --gbit 10 --latency-us 20" \
    "$SRC/jobs/scaling_study.sh" > "$WORK/study.log" 2>&1
rc=$?
[ $rc = 0 ] || tail -n 40 "$WORK/study.log" >&2
check "scaling_study.sh succeeded (rc $rc)" test $rc = 0
for f in report.txt scaling.csv model.json validation.csv predictions.csv scaling.png; do
    check "wrote $f" test -s "$WORK/out/$f"
done
check "2 measured points" test "$(tail -n +2 "$WORK/out/scaling.csv" | wc -l)" = 2
check "report starts with the summary" grep -q '^0. Summary' <(sed -n 4p "$WORK/out/report.txt")
# The summary's efficiency of the 2-host point equals img/s(2 hosts) / (2 x img/s(1 rank)) from scaling.csv.
want=$(/usr/bin/python3 - "$WORK/out/scaling.csv" <<'PY'
import csv, sys
r = {x["where"]: float(x["images_per_s"]) for x in csv.DictReader(open(sys.argv[1]))}
print(f"{r['hosts-net'] / (2 * r['local']) * 100:.0f}%")
PY
)
check "summary gives the 2-host efficiency ($want)" grep -qE "^ +hosts-net +weak +cnn +2 +[0-9]+ +$want " "$WORK/out/report.txt"
check "summary predicts the knee for the given cluster" grep -q "predicted for your cluster (cnn, 64 ranks, 4 per node, 10 Gbit/s, 20 us)" "$WORK/out/report.txt"
check "no namespace of the instance left" test -z "$(ip netns list | grep "^$NAME")"
check "no bridge of the instance left" test -z "$(ip -o link show | grep "${NAME}br")"
check "the instance's files (daemon pid files, logs, config) are removed" test ! -e "/run/ringtrain-slurm/$NAME"
echo "1 passed, 0 failed"
