#!/usr/bin/env bash
# Exposed expert all-to-all in training (issue 43's goal: at most 15% of the step at expert 2).
# gpt width 128, depth 4, 8 experts top-2 (hidden 2h) at parallel.expert = 2 on 2 ranks, one epoch
# of the fortunes' first 600 kB (bytes), batch 8 of 128 tokens, the router balanced three ways:
#   aux       the Switch aux loss, model.aux_loss_coeff = 0.01 (the default)
#   aux+bias  and the aux-loss-free bias, model.moe_bias_update_rate = 0.003 (DeepSeek-V3)
#   cap1.25   aux and capacity factor 1.25: an expert takes at most 1.25x its share, the rest dropped
# Each row: the epoch's compute time, the exposed all-to-all (time inside the exchanges' calls:
# what compute did not hide, waiting for the slower peer included), its share of the compute
# beside the goal, the per-micro-batch and epoch max/mean tokens per expert (mean of the 4 layers)
# and the dropped fraction. Rounds interleave the rows; the end prints each row's median.
#   bench/moe_exposed_alltoall.sh [build-dir] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/ringtrain
ROUNDS=${2:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat $(ls -d /usr/share/games/fortunes/* | grep -v -e '\.dat$' -e '\.u8$' | sort) > "$WORK/all.txt"
head -c 600000 "$WORK/all.txt" > "$WORK/fortunes.txt"
"$BIN" prepare --dataset text --input "$WORK/fortunes.txt" --out "$WORK/bytes" > /dev/null
COMMON=(--set model.name=gpt --set model.width=128 --set model.heads=4 --set model.depth=4 --set data.seq_len=128
        --set train.threads=1 --set data.train="$WORK/bytes" --set data.test="$WORK/bytes" --batch-size 8
        --epochs 1 --lr 3e-3 --set schedule.name=constant --set schedule.warmup_epochs=0 --log-format plain
        --no-eval --set model.mlp_ratio=2 --set model.experts=8 --set model.top_k=2 --set parallel.expert=2)
declare -A VARIANT=(
  [aux]="--set model.aux_loss_coeff=0.01"
  [aux+bias]="--set model.aux_loss_coeff=0.01 --set model.moe_bias_update_rate=0.003"
  [cap1.25]="--set model.aux_loss_coeff=0.01 --set model.capacity_factor=1.25"
)
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) ($(nproc) cores), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# round variant load compute_s exposed_s in_flight_s exposed/compute (goal <= 0.15) max/mean epoch_max/mean dropped%"
out=$WORK/rows
for r in $(seq "$ROUNDS"); do
  for v in aux aux+bias cap1.25; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2086
    line=$(mpirun -np 2 --oversubscribe --bind-to none "$BIN" train "${COMMON[@]}" ${VARIANT[$v]} 2>&1 |
           grep -m1 '^epoch 1/1:' || true)
    [ -n "$line" ] || { echo "$r $v $load FAILED"; continue; }
    /usr/bin/python3 - "$r" "$v" "$load" "$line" <<'PY' | tee -a "$out"
import re, sys
r, v, load, line = sys.argv[1:5]
compute = float(re.search(r"compute ([0-9.]+)s", line).group(1))
m = re.search(r"expert all-to-all ([0-9.]+)s exposed of ([0-9.]+)s in flight", line)
exposed, flight = float(m.group(1)), float(m.group(2))
mm = [float(x) for x in re.findall(r"max/mean ([0-9.]+) \(epoch", line)]
em = [float(x) for x in re.findall(r"\(epoch ([0-9.]+)\)", line)]
dr = [float(x) for x in re.findall(r"dropped ([0-9.]+)%", line)]
mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
print(f"{r} {v} {load} {compute:.1f} {exposed:.2f} {flight:.2f} {exposed / compute:.3f} "
      f"{mean(mm):.2f} {mean(em):.2f} {mean(dr):.1f}")
PY
  done
done
echo "# medians over $ROUNDS round(s): variant exposed/compute (goal <= 0.15) max/mean epoch_max/mean dropped%"
/usr/bin/python3 - "$out" <<'PY'
import sys, statistics as st, collections
rows = collections.OrderedDict()
for l in open(sys.argv[1]):
    f = l.split()
    rows.setdefault(f[1], []).append([float(x) for x in f[6:10]])
for v, xs in rows.items():
    med = [st.median(c) for c in zip(*xs)]
    print(f"{v} {med[0]:.3f} {med[1]:.2f} {med[2]:.2f} {med[3]:.1f}")
PY
